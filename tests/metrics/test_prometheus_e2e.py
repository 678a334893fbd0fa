#!/usr/bin/env python3
"""Monitoring end to end: a real Prometheus (Debian's) scrapes a coordinator and 2 workers while a
training job runs, and every PromQL expression of deploy/ returns data through its HTTP API.

  test_prometheus_e2e.py --adjsh build/cli/adjsh [--prometheus /usr/bin/prometheus]

Starts on 127.0.0.1 only, each on a free port: `adjsh coordinator --metrics-listen`, two
`adjsh worker --metrics-listen`, and Prometheus with a generated configuration (scrape and rule
evaluation every second, deploy/prometheus/rules.yml loaded). Submits a small training job with
many steps, and while it runs checks:
  * every metric name the dashboards and rules use is exported by the live /metrics endpoints
    (the GPU gauges excepted, which CPU workers must not export: checked absent);
  * every dashboard expression and every rule expression (alerts without their final
    comparison, tests/metrics/promql.py) returns at least one series through /api/v1/query,
    except those on GPU gauges, which must return none on CPU workers;
  * each worker's adjsh_worker_resident_memory_bytes agrees with its VmRSS
    (/proc/PID/status) within 10%;
  * on a real fault (worker 1 frozen while it holds a task, then killed) the full expressions
    of AdjshLeaseExpiries and AdjshWorkerDown return data, Prometheus reports the first firing
    and the second pending (firing waits for the rule's `for: 1m`), and training goes on.
Then cancels the job and stops every process, also on failure. Exit 0 when all checks pass.
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import promql  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
GPU_PREFIX = "adjsh_worker_gpu_"
LEASE_MS = 1500
JOB = ["--hidden-size", "32", "--layers", "2", "--state-size", "8", "--context", "2048",
       "--chunk", "256", "--steps", "100000", "--warmup", "2", "--checkpoint-every", "0",
       "--expected-workers", "2"]  # AdjshWorkerShortfall's gauge


def die_with_parent():
    """In the child: SIGKILL when this test process dies, even killed by a timeout."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


class Proc:
    """A child process whose stderr is collected by a thread (for its 'metrics on' line)."""

    def __init__(self, name, cmd, cwd=None):
        self.name, self.lines = name, []
        self.p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, preexec_fn=die_with_parent)
        for stream in (self.p.stdout, self.p.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, prefix, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            for line in list(self.lines):
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: no '{prefix}' line; output:\n" + "\n".join(self.lines))

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def query(prom, expr):
    url = f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = json.loads(http_get(url))
    if body.get("status") != "success":
        raise RuntimeError(f"query {expr!r}: {body}")
    return body["data"]["result"]


def vm_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    ap.add_argument("--prometheus", default="/usr/bin/prometheus")
    args = ap.parse_args()
    adjsh = os.path.abspath(args.adjsh)
    tmp = tempfile.mkdtemp(prefix="adjsh-prom-")
    procs, failures = [], []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    coordinator_addr, job = None, None
    try:
        coord = Proc("coordinator", [adjsh, "coordinator", "--listen", "127.0.0.1:0",
                                     "--state-dir", os.path.join(tmp, "state"),
                                     "--lease-ms", str(LEASE_MS), "--threads", "1",
                                     "--data-root", tmp, "--insecure-local",
                                     "--metrics-listen", "127.0.0.1:0"])
        procs.append(coord)
        coordinator_addr = coord.wait_line("listening on ")
        coord_metrics = coord.wait_line("metrics on ")
        workers = []
        for k in range(2):
            w = Proc(f"worker {k}", [adjsh, "worker", "--coordinator", coordinator_addr,
                                     "--name", f"w{k}", "--metrics-listen", "127.0.0.1:0"])
            procs.append(w)
            workers.append((w, w.wait_line("metrics on ")))

        prom_addr = f"127.0.0.1:{free_port()}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [os.path.join(DEPLOY, "prometheus", "rules.yml")],
            "scrape_configs": [
                {"job_name": "adjsh-coordinator",
                 "static_configs": [{"targets": [coord_metrics]}]},
                {"job_name": "adjsh-worker",
                 "static_configs": [{"targets": [m for _, m in workers]}]},
            ],
        }
        config_path = os.path.join(tmp, "prometheus.yml")
        with open(config_path, "w") as f:
            json.dump(config, f)  # JSON is YAML
        prom = Proc("prometheus", [args.prometheus, f"--config.file={config_path}",
                                   f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
                                   f"--web.listen-address={prom_addr}"], cwd=tmp)
        procs.append(prom)
        end = time.time() + 60
        while True:
            try:
                http_get(f"http://{prom_addr}/-/ready")
                break
            except OSError:
                if time.time() > end or prom.p.poll() is not None:
                    raise RuntimeError("Prometheus did not start:\n" + "\n".join(prom.lines))
                time.sleep(0.2)

        r = subprocess.run([adjsh, "submit", "--coordinator", coordinator_addr, *JOB,
                            "--checkpoint-dir", os.path.join(tmp, "ckpt")],
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 0, f"submit: {r.stderr.strip()}")
        job = r.stdout.strip()

        # Every expression returns data while the job runs.
        exprs = promql.dashboard_expressions(DEPLOY) + promql.rule_expressions(DEPLOY)
        pending = {where: expr for where, expr in exprs if GPU_PREFIX not in expr}
        end = time.time() + 120
        while pending and time.time() < end:
            for where, expr in list(pending.items()):
                if query(prom_addr, expr):
                    del pending[where]
            if pending:
                time.sleep(1)
        for where, expr in exprs:
            if GPU_PREFIX in expr:
                check(not query(prom_addr, expr), f"{where}: no data on CPU workers: {expr}")
            else:
                check(where not in pending, f"{where}: returns data: {expr}")
        # Names: what deploy/ uses against what the live endpoints export (now that a step is done).
        series = set()
        for addr in [coord_metrics] + [m for _, m in workers]:
            series |= promql.parse_exposition(http_get(f"http://{addr}/metrics"))[1]
        recorded = promql.recorded_names(DEPLOY)
        for name, where in sorted(promql.referenced_metrics(exprs).items()):
            if name in recorded:
                continue
            if name.startswith(GPU_PREFIX):
                check(name not in series, f"{name} not exported by CPU workers")
            else:
                check(name in series, f"{name} exported (used by {where[0]})")

        st = subprocess.run([adjsh, "status", "--coordinator", coordinator_addr, "--job", job,
                             "--json"], capture_output=True, text=True, timeout=30)
        state = json.loads(st.stdout or "{}")
        check(state.get("state") == "RUNNING",
              f"job {job} still running while queried (state {state.get('state')}, "
              f"step {state.get('step')})")

        # Worker memory: the scraped series against the process's VmRSS.
        for w, addr in workers:
            ratios = []
            for _ in range(6):
                res = query(prom_addr, f'adjsh_worker_resident_memory_bytes{{instance="{addr}"}}')
                rss = vm_rss(w.p.pid)
                if res:
                    ratios.append(float(res[0]["value"][1]) / rss)
                    if abs(ratios[-1] - 1) <= 0.10:
                        break
                time.sleep(1.5)
            check(bool(ratios) and abs(ratios[-1] - 1) <= 0.10,
                  f"{w.name}: adjsh_worker_resident_memory_bytes / VmRSS = "
                  f"{', '.join(f'{x:.3f}' for x in ratios)} (within 10%)")

        # Two alerts on a real fault: worker 1 frozen while it holds a task (its lease expires:
        # AdjshLeaseExpiries fires), then killed (its endpoint is down: AdjshWorkerDown pends,
        # firing would take its `for: 1m`). Training goes on with worker 0.
        w1 = workers[1][0]

        def coordinator_value(name):
            text = http_get(f"http://{coord_metrics}/metrics")
            for line in text.splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
            return 0.0

        expired0 = coordinator_value("adjsh_coordinator_leases_expired_total")
        for attempt in range(1, 11):  # it may hold no task when it is frozen: try again
            os.kill(w1.p.pid, signal.SIGSTOP)
            time.sleep(LEASE_MS / 1000 + 1.5)
            if coordinator_value("adjsh_coordinator_leases_expired_total") > expired0:
                break
            os.kill(w1.p.pid, signal.SIGCONT)
            time.sleep(0.3)
        check(coordinator_value("adjsh_coordinator_leases_expired_total") > expired0,
              f"a lease of the frozen worker expired (freeze {attempt})")
        w1.p.kill()
        w1.p.wait()
        steps0 = coordinator_value("adjsh_coordinator_steps_total")
        alerts, firing = {}, {}
        end = time.time() + 60
        while time.time() < end:
            body = json.loads(http_get(f"http://{prom_addr}/api/v1/alerts"))
            alerts = {a["labels"]["alertname"]: a["state"] for a in body["data"]["alerts"]}
            firing = {w: bool(query(prom_addr, r["expr"])) for w, r in promql.alert_rules(DEPLOY)
                      if w in ("AdjshLeaseExpiries", "AdjshWorkerDown")}
            if alerts.get("AdjshLeaseExpiries") == "firing" and \
                    alerts.get("AdjshWorkerDown") == "pending" and all(firing.values()):
                break
            time.sleep(1)
        check(all(firing.values()) and len(firing) == 2,
              f"the full alert expressions return data after the fault: {firing}")
        check(alerts.get("AdjshLeaseExpiries") == "firing" and
              alerts.get("AdjshWorkerDown") == "pending",
              f"Prometheus alerts after the fault: {alerts}")
        end = time.time() + 60
        while coordinator_value("adjsh_coordinator_steps_total") < steps0 + 2 and time.time() < end:
            time.sleep(0.5)
        check(coordinator_value("adjsh_coordinator_steps_total") >= steps0 + 2,
              "training goes on with one worker")
    except Exception as e:  # noqa: BLE001 - reported as a failure, everything is still stopped
        check(False, f"{type(e).__name__}: {e}")
    finally:
        if job and coordinator_addr:
            subprocess.run([adjsh, "cancel", "--coordinator", coordinator_addr, "--job", job],
                           capture_output=True, timeout=30)
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
