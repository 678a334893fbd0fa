#!/usr/bin/python3
"""A coordinator and 4 workers as 5 hosts over real, rate-limited links (issue 50's third part).

  test_multihost.py --adjsh build/cli/adjsh [--runs N] [--json FILE] [--skip-timing]

  * Each host is a network namespace with one veth link to a bridge (tests/net/netns.py); the
    links are limited with `tc ... tbf` at each end, cut with `ip link set down`.
  * Mutual TLS everywhere: the coordinator's and each worker's certificate name the host's
    address (no --tls-server-name, no --peer-tls-name), and the job API takes a token. The
    workers serve their peer endpoints (--peer-listen), so the partials go up the worker tree
    over the links.
  * Timing: one job of the same model on unlimited links (the calibration: `bench/fleet_sim.py
    calibrate --bandwidth-gbps 10` fits the per-RPC overhead to its median step's tasks), then
    at 1 Gbit/s and 100 Mbit/s. Each link speed's measured step (the median of the job's own
    step times, adjsh watch) is compared with `fleet_sim.py replay` of that step's trace (its
    tasks' compute times, its span owners) at the link's rate with the fitted overhead: within
    15%. Its own compute times, because 5 processes share this machine's 2 cores and a task's
    time depends on how many others compute beside it, which the simulator does not model
    (on unlimited links and at 1 Gbit/s the step is bound by the CPUs, at 100 Mbit/s by the
    links); what is checked is the link model.
  * Faults, each a 6-step job on 1 Gbit/s links whose final weights and optimizer state must
    be bitwise those of `adjsh train` in-process: a worker's link cut at its first forward task
    of step 2, and another's at its first backward task (the step begins again without it; the
    link comes back after the step and the worker, heard from again, takes tasks of the later
    steps); a tree parent's link cut while a child's partials go up to it; the coordinator's
    link throttled to 10 Mbit/s for steps 2-3 (slower than the others, no restart).
Namespaces, links and processes are removed at the end, also on failure. Needs root and
iproute2: where missing it exits 77 (skipped), except under CI=true, where that fails.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)
from harness import Cluster, Results, final_files, train_reference, wait_for  # noqa: E402
import netns  # noqa: E402
from certs import make_host_certs  # noqa: E402

WORKERS = ["w0", "w1", "w2", "w3"]
PORT, PEER_PORT = 50051, 50052
# D=128 K=4 V=4096: 3.1 MB of f32 parameters, so that a copy takes 0.25 s at 100 Mbit/s;
# T = 4096 in 4 spans (one per worker) of 4 chunks.
SHAPE = {"D": 128, "K": 4, "N": 16, "V": 4096, "E": 2}
JOB = ["--hidden-size", "128", "--layers", "4", "--state-size", "16", "--vocab-size", "4096",
       "--context", "4096", "--chunk", "256", "--spans", "4", "--lr", "1e-2", "--warmup", "2",
       "--checkpoint-every", "0"]
FAULT_STEPS = 6  # a fault in step 2, the link back for steps 3-6
JOB_LIMIT_S = 45
STEP_LINE = re.compile(r" step (\d+)/\d+ .*? \| ([0-9.]+) s \| par")


class Fleet:
    """The hosts, the coordinator and the workers; their processes are the cluster's
    (harness.Cluster), which stop() ends."""

    def __init__(self, adjsh, tmp, hosts):
        self.adjsh, self.tmp, self.hosts = adjsh, tmp, hosts
        self.certs = os.path.join(tmp, "certs")
        self.addr = f"{hosts.addr('coord')}:{PORT}"
        self.trace = os.path.join(tmp, "trace.jsonl")
        self.cluster = Cluster(adjsh, tmp)

    def _spawn(self, host, args, log):
        f = open(os.path.join(self.tmp, log), "ab")
        self.cluster.logs.append(f)
        self.cluster.procs.append(subprocess.Popen(
            self.hosts.exec_prefix(host) + [self.adjsh, *args], stdout=subprocess.DEVNULL,
            stderr=f))

    def start(self, lease_ms):
        c = self.certs
        self._spawn("coord", ["coordinator", "--listen", self.addr, "--state-dir",
                              os.path.join(self.tmp, "state"), "--data-root", self.tmp,
                              "--lease-ms", str(lease_ms), "--threads", "1", "--trace",
                              self.trace, "--tls-cert", f"{c}/coord.pem", "--tls-key",
                              f"{c}/coord.key", "--tls-ca", f"{c}/ca.pem",
                              "--auth-token-file", f"{c}/token"], "coordinator.log")
        for w in WORKERS:
            a = self.hosts.addr(w)
            self._spawn(w, [
                "worker", "--coordinator", self.addr, "--name", w, "--tls-ca", f"{c}/ca.pem",
                "--tls-cert", f"{c}/{w}.pem", "--tls-key", f"{c}/{w}.key", "--peer-listen",
                f"{a}:{PEER_PORT}", "--verbose"], f"{w}.log")

    def client(self, *args):
        """The command line of adjsh ARGS on the coordinator's host, over TLS with the token."""
        c = self.certs
        return self.hosts.exec_prefix("coord") + [
            self.adjsh, *args, "--coordinator", self.addr, "--tls-ca", f"{c}/ca.pem",
            "--auth-token-file", f"{c}/token"]

    def cli(self, *args, timeout=120):
        return subprocess.run(self.client(*args), capture_output=True, text=True,
                              timeout=timeout)

    def connected(self):
        r = self.cli("status", "--json", timeout=30)
        try:
            page = json.loads(r.stdout) if r.returncode == 0 else {}
        except ValueError:
            return False
        return int(page.get("workers_connected", 0)) >= len(WORKERS)  # int64: a string

    def log(self, w):
        with open(os.path.join(self.tmp, f"{w}.log"), errors="replace") as f:
            return f.read()

    def stop(self):
        """Ends every process; returns the pids that would not stop."""
        return self.cluster.stop()


class Job:
    """One submitted job, watched as it runs: its step lines, and when each arrived."""

    def __init__(self, fleet, name, steps):
        self.fleet, self.name = fleet, name
        self.ckpt = os.path.join(fleet.tmp, name)
        self.trace_from = os.path.getsize(fleet.trace) if os.path.exists(fleet.trace) else 0
        r = fleet.cli("submit", *JOB, "--steps", str(steps), "--checkpoint-dir", self.ckpt)
        self.id = r.stdout.strip() if r.returncode == 0 else None
        self.submit_err = r.stderr
        self.steps = {}  # step -> its seconds
        self.watch = None
        if self.id:
            self.watch = subprocess.Popen(fleet.client("watch", "--job", self.id),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)
            fleet.cluster.procs.append(self.watch)
        self.lines = []
        self.after = []  # checks to run once the job has ended

    def _take(self, line):
        """A line of the watch: kept, and a step's seconds noted."""
        self.lines.append(line.rstrip())
        m = STEP_LINE.search(line)
        if m:
            self.steps[int(m.group(1))] = float(m.group(2))

    def until_step(self, n, timeout=300):
        """Reads the watch until step n is reported; False if the job ended or time ran out."""
        deadline = time.time() + timeout
        while n not in self.steps and time.time() < deadline:
            line = self.watch.stdout.readline()
            if not line:
                return False
            self._take(line)
        return n in self.steps

    def finish(self, timeout=600):
        try:
            out, err = self.watch.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.watch.kill()
            out, err = self.watch.communicate()
        for line in out.splitlines():
            self._take(line)
        return self.watch.returncode == 0, err

    def trace_file(self):
        """This job's lines of the coordinator's trace, in a file of their own."""
        path = os.path.join(self.fleet.tmp, f"trace-{self.name}.jsonl")
        with open(self.fleet.trace) as src, open(path, "w") as dst:
            src.seek(self.trace_from)
            dst.write(src.read())
        return path


def leased(log_text, kind):
    """The matches (groups: layer, span) of each `task ... leased: KIND layer k span s/S`."""
    return list(re.finditer(rf"leased: {kind} layer (\d+) span (\d+)/", log_text))


def wait_lease(fleet, w, kind, after, timeout=120):
    """Waits until worker w's log shows a lease of KIND past offset `after`."""
    return wait_for(lambda: any(m.start() >= after for m in leased(fleet.log(w), kind)),
                    timeout, interval=0.02)


def sim(*args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "fleet_sim.py"), *args],
                       capture_output=True, text=True, timeout=300)
    return r


def timing(fleet, record, out, steps=6):
    """Calibration on unlimited links, then 1 Gbit/s and 100 Mbit/s: measured against
    predicted steps. A run's measured step is the median of its steps 2.. (step 1 also opens
    the connections); the calibration is the unlimited run's median step (trace steps count
    from 0: watch step n is trace step n - 1)."""
    model = ",".join(str(SHAPE[k]) for k in "DKNVE")
    runs = {}
    for label, rate in [("unlimited", None), ("1 Gbit/s", 1e9), ("100 Mbit/s", 100e6)]:
        fleet.hosts.limit_all(rate)
        job = Job(fleet, "timing-" + label.split()[0], steps=steps)
        ok, err = job.finish() if job.id else (False, job.submit_err)
        record(f"timing job at {label}: SUCCEEDED", ok and len(job.steps) == steps, err[-1500:])
        if not ok or len(job.steps) != steps:
            return
        later = sorted(range(2, steps + 1), key=lambda n: job.steps[n])
        median_step = later[len(later) // 2]
        runs[label] = (job.steps[median_step], median_step - 1, job.trace_file())
        print(f"  {label}: steps {[job.steps[n] for n in range(1, steps + 1)]} s", flush=True)
    fleet.hosts.limit_all(None)
    measured, cal_step, trace = runs["unlimited"]
    cal_json = os.path.join(fleet.tmp, "calibrate.json")
    # The unlimited links are veth pairs: memory copies, held at 10 Gbit/s (a step's 9 MB
    # take 7 ms at that rate; a task's own few KB cannot fit a bandwidth); the per-RPC overhead
    # is fitted to its tasks.
    r = sim("calibrate", "--trace", f"{trace}:{len(WORKERS)}:{measured}", "--step",
            str(cal_step), "--model", model, "--bandwidth-gbps", "10", "--json", cal_json)
    record("fleet_sim.py calibrate on the unlimited links' median step", r.returncode == 0,
           r.stderr)
    if r.returncode != 0:
        return
    print(r.stdout, flush=True)
    cal = json.load(open(cal_json))
    rows = []
    for label, gbps in [("1 Gbit/s", 1.0), ("100 Mbit/s", 0.1)]:
        pj = os.path.join(fleet.tmp, f"predict-{gbps}.json")
        got, step, trace = runs[label]
        r = sim("replay", "--trace", trace, "--step", str(step), "--workers",
                str(len(WORKERS)), "--reduce", "tree", "--owners", "recorded", "--model", model,
                "--bandwidth-gbps", str(gbps), "--latency-us", str(cal["latency_us"]),
                "--rpc-overhead-us", str(cal["rpc_overhead_us"]), "--json", pj)
        if r.returncode != 0:
            record(f"fleet_sim.py replay at {label}", False, r.stderr)
            return
        row = next(x for x in json.load(open(pj))["rows"] if x["W"] == len(WORKERS))
        predicted = row["tree"]["step_s"]
        err = (predicted - got) / got
        rows.append({"link": label, "measured_s": got, "predicted_s": predicted, "error": err})
        record(f"{label}: measured step {got:.3f} s, predicted {predicted:.3f} s "
               f"({err * 100:+.1f}%, within 15%)", abs(err) <= 0.15)
    out["timing"] = {"calibration_s": measured, "calibration_predicted_s": cal["runs"][0][
        "predicted_s"], "rpc_overhead_us": cal["rpc_overhead_us"], "rows": rows}
    print("| link (each way) | measured step s | predicted step s | error |")
    print("|---|---|---|---|")
    own = cal["runs"][0]
    print(f"| unlimited (the calibration) | {measured:.3f} | {own['predicted_s']:.3f} | "
          f"{own['relative_error'] * 100:+.1f}% |")
    for x in rows:
        print(f"| {x['link']} | {x['measured_s']:.3f} | {x['predicted_s']:.3f} | "
              f"{x['error'] * 100:+.1f}% |", flush=True)


def owners(fleet, job_from):
    """span -> worker, from the workers' forward leases since the offsets job_from."""
    own = {}
    for w in WORKERS:
        for m in leased(fleet.log(w)[job_from[w]:], "SPAN_FORWARD"):
            own.setdefault(int(m.group(2)), w)
    return own


def offsets(fleet):
    return {w: len(fleet.log(w)) for w in WORKERS}


def rejoined(fleet, w, since):
    """Worker w leased a task after the offset `since` of its log (a worker the coordinator
    dropped registers again first; one whose heartbeats come back in time keeps its id)."""
    return " leased: " in fleet.log(w)[since:]


def fault_job(fleet, record, ref, name, inject, steps=FAULT_STEPS, restarts=True):
    """A job with one fault injected by inject(job, start_offsets) -> (injected, what);
    bitwise the reference.
    restarts: the fault hit a step of the worker tree, which began again (the watch's
    "N restarts")."""
    start = offsets(fleet)
    job = Job(fleet, name, steps)
    if not job.id:
        record(f"{name}: submitted", False, job.submit_err)
        return
    t0 = time.time()
    injected, what = inject(job, start)
    record(f"{name}: fault injected ({what})", injected)
    ok, err = job.finish()
    for check in job.after:
        check()
    if restarts:
        record(f"{name}: the step began again without the lost worker",
               any(re.search(r"\| \d+ restarts", line) for line in job.lines))
    same = ok and final_files(job.ckpt) == ref
    took = time.time() - t0
    print(f"  {name}: {took:.1f} s; " + "; ".join(job.lines[-1:]), flush=True)
    record(f"{name}: SUCCEEDED, weights and optimizer state bitwise the in-process run's",
           same, (err[-1500:], "\n".join(job.lines[-8:])))
    # Undisturbed, such a job takes 3 s; a fault costs a few leases. A stall is a failure.
    record(f"{name}: done in {took:.0f} s (under {JOB_LIMIT_S} s)", took < JOB_LIMIT_S)


def faults(fleet, record, ref, lease_ms):
    hosts = fleet.hosts

    def cut_then_back(kind, pick):
        def inject(job, start):
            if not job.until_step(1):
                return False, "step 1 never came"
            own = owners(fleet, start)
            victim = pick(own)
            at = offsets(fleet)[victim]
            if not wait_lease(fleet, victim, kind, at):
                return False, f"{victim} never leased {kind}"
            hosts.cut(victim)
            spans = sorted(s for s, w in own.items() if w == victim)
            print(f"  cut {victim}'s link at its {kind} lease (spans {spans})", flush=True)
            job.until_step(2)  # the others finish the step without it
            back = len(fleet.log(victim))
            hosts.restore(victim)
            # Checked once the job has ended: the worker is back and leases tasks of the
            # job's later steps.
            job.after.append(lambda: record(
                f"{job.name}: {victim}'s link back: it takes tasks of the later steps",
                rejoined(fleet, victim, back), fleet.log(victim)[back:][-1500:]))
            return True, f"{victim} cut at {kind}"
        return inject

    # A leaf of the span tree (its spans' partials go to another worker), cut mid-forward; the
    # owner of span 1 mid-backward; span 2's owner, the parent of span 3's sums, while they come.
    fault_job(fleet, record, ref, "cut-mid-forward",
              cut_then_back("SPAN_FORWARD", lambda own: own[3]))
    fault_job(fleet, record, ref, "cut-mid-backward",
              cut_then_back("SPAN_BACKWARD", lambda own: own[1]))

    def parent_cut(job, start):
        if not job.until_step(1):
            return False, "step 1 never came"
        own = owners(fleet, start)
        parent, child = own[2], own[3]
        at = offsets(fleet)[child]
        # The child's first backward task has ended once it leases its second: its partial
        # is on its way up to the parent.
        if not wait_for(lambda: len([m for m in leased(fleet.log(child), "SPAN_BACKWARD")
                                     if m.start() >= at]) >= 2, 120, interval=0.02):
            return False, "the child never reached its backward"
        hosts.cut(parent)
        time.sleep(lease_ms / 1000 * 2)
        hosts.restore(parent)
        return True, f"{parent} (parent of {child}'s sums) cut for {2 * lease_ms} ms"
    fault_job(fleet, record, ref, "tree-parent-cut", parent_cut)

    def throttle(job, start):
        if not job.until_step(1):
            return False, "step 1 never came"
        hosts.limit("coord", 10e6)
        job.until_step(3)
        hosts.limit("coord", hosts.rates.get("w0"))

        def slower():
            slow = [job.steps.get(n) for n in (2, 3)]
            fast = [job.steps.get(n) for n in range(4, FAULT_STEPS + 1)]
            record(f"{job.name}: steps 2-3 at 10 Mbit/s ({slow} s) slower than steps 4-"
                   f"{FAULT_STEPS} at 1 Gbit/s ({fast} s)",
                   None not in slow + fast and min(slow) > max(fast))
        job.after.append(slower)
        return True, "the coordinator's link at 10 Mbit/s for steps 2-3"
    fault_job(fleet, record, ref, "coordinator-at-10Mbit", throttle, restarts=False)


def body(adjsh, tmp, record, a, out):
    hosts = netns.Hosts(["coord", *WORKERS])
    fleet = Fleet(adjsh, tmp, hosts)
    try:
        hosts.create()
        make_host_certs(fleet.certs, {n: hosts.addr(n) for n in hosts.names})
        fleet.start(a.lease_ms)
        ok = wait_for(fleet.connected, 60, interval=0.5)
        record("coordinator and 4 workers on 5 hosts, mutual TLS by address: all registered",
               ok, open(os.path.join(tmp, "coordinator.log")).read()[-1500:])
        if not ok:
            return
        if not a.skip_timing:
            timing(fleet, record, out)
        ref_r, ref = train_reference(adjsh, os.path.join(tmp, "reference"),
                                     [*JOB, "--steps", str(FAULT_STEPS)])
        record("in-process reference (adjsh train)", ref is not None, ref_r.stderr[-1500:])
        if ref is None:
            return
        hosts.limit_all(1e9)
        faults(fleet, record, ref, a.lease_ms)
    finally:
        leftover = fleet.stop()
        record("every started process stopped", not leftover, leftover)
        left = hosts.remove()
        record("namespaces removed", not left, str(left))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adjsh", required=True)
    ap.add_argument("--lease-ms", type=int, default=2000, help="the coordinator's lease")
    ap.add_argument("--skip-timing", action="store_true", help="only the faults")
    ap.add_argument("--json", help="write the timing rows here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    why = netns.missing_tools()
    if why:
        if os.environ.get("CI") == "true":
            print(f"FAIL the hosts cannot be made here under CI=true: {why}")
            return 1
        print(f"SKIP multi-host: {why}")
        return 77
    # A SIGTERM (ctest's timeout, a user's kill) unwinds like a failure: the finally clauses
    # stop the processes and remove the namespaces, undisturbed by a second one (`timeout`
    # passes its own on).
    def terminated(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit("terminated")
    signal.signal(signal.SIGTERM, terminated)
    tmp = tempfile.mkdtemp(prefix="adjsh-hosts-")
    os.chmod(tmp, 0o755)
    res, out = Results(), {}
    try:
        body(os.path.abspath(a.adjsh), tmp, res.record, a, out)
    except Exception as e:  # a bug of the test's own: a failed check, then the cleanup
        res.record("test harness", False, repr(e))
    finally:
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        if a.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return res.summary()


if __name__ == "__main__":
    sys.exit(main())
