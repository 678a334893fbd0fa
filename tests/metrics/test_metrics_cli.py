#!/usr/bin/env python3
"""The metrics flags of the commands: `adjsh train --workers 2 --metrics-listen ...
--worker-metrics-listen ...` serves the coordinator's metrics and each spawned worker's (on
HOST:PORT+i, or a free port each; CPU workers without GPU gauges) and trains bitwise as without
them; in-process `adjsh train --metrics-listen` serves the job's gauges (gradient norm, learning
rate and held-out loss among them) without the workers' families; bad metrics addresses are
refused clearly.

  test_metrics_cli.py --adjsh build/cli/adjsh

Everything on 127.0.0.1; every process is stopped at the end, also on failure.
"""
import argparse
import ctypes
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

MODEL = ["--hidden-size", "32", "--layers", "2", "--state-size", "8", "--context", "1024",
         "--chunk", "256", "--threads", "1", "--steps", "100000", "--checkpoint-every", "0"]
failures = []


def die_with_parent():
    """In the child: SIGKILL when this test process dies, even killed by a timeout."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def scrape(addr):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        return r.read().decode()


def value(text, name):
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def two_free_ports():
    """P such that P and P + 1 are both free now."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", p + 1))
                    return p
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def start_train(adjsh, args):
    """adjsh train ARGS in the background; (process, its stderr lines so far, filled by a
    thread)."""
    p = subprocess.Popen([adjsh, "train", *args], stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True, preexec_fn=die_with_parent)
    lines = []
    threading.Thread(target=lambda: [lines.append(l.rstrip()) for l in p.stderr],
                     daemon=True).start()
    return p, lines


def train_with_metrics(adjsh, tmp, worker_listen):
    """Runs adjsh train --workers 2 with metrics; returns (coordinator addr, [worker addrs])
    once a few steps are done and both workers report tasks, then stops it."""
    p, lines = start_train(adjsh, [*MODEL, "--workers", "2", "--checkpoint-dir",
                                   os.path.join(tmp, "ckpt"), "--metrics-listen", "127.0.0.1:0",
                                   "--worker-metrics-listen", worker_listen])
    try:
        end = time.time() + 60
        addrs = []
        while time.time() < end and len(addrs) < 3 and p.poll() is None:
            addrs = [l.split()[-1] for l in list(lines) if l.startswith("metrics on ")]
            time.sleep(0.1)
        check(len(addrs) == 3, f"train logs 3 metrics addresses: {addrs}")
        if len(addrs) < 3:
            print("\n".join(lines))
            return None, []
        # The coordinator's line comes after the workers are started; the workers' in any order.
        coord = next(a for a in addrs if "adjsh_coordinator_steps_total" in scrape(a))
        workers = sorted(a for a in addrs if a != coord)
        while time.time() < end:
            c = scrape(coord)
            w = [scrape(a) for a in workers]
            if (value(c, "adjsh_coordinator_steps_total") or 0) >= 2 and \
                    all((value(t, "adjsh_worker_tasks_done_total") or 0) > 0 for t in w):
                break
            time.sleep(0.3)
        check((value(c, "adjsh_coordinator_steps_total") or 0) >= 2 and
              value(c, "adjsh_coordinator_loss") is not None and
              value(c, "adjsh_coordinator_workers_connected") == 2 and
              'job_id="train"' in c and "adjsh_coordinator_jobs" not in c,
              f"coordinator metrics of adjsh train at {coord}: steps, loss, 2 workers, job train")
        check(value(c, "adjsh_coordinator_job_expected_workers") == 2,
              "adjsh train --workers 2 expects 2 workers (the AdjshWorkerShortfall gauge)")
        names = sorted(re.search(r'worker="([^"]*)"', t).group(1) for t in w)
        check(names == ["local-0", "local-1"] and
              all((value(t, "adjsh_worker_tasks_done_total") or 0) > 0 for t in w),
              f"each spawned worker serves its metrics ({', '.join(workers)}: {names})")
        gpu = [l for t in w for l in t.splitlines() if l.startswith("adjsh_worker_gpu_")]
        check(not gpu and all('device="cpu"' in t for t in w),
              f"CPU workers export no GPU memory gauges (not even 0): {gpu}")
        return coord, workers
    finally:
        p.terminate()  # the workers die with it (parent-death signal)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def train_in_process_metrics(adjsh, tmp):
    """adjsh train without workers, --metrics-listen: the job's gauges (loss, gradient norm,
    learning rate, held-out loss) and none of the workers' families."""
    val = os.path.join(tmp, "val.u16")
    with open(val, "wb") as f:
        f.write(b"".join(bytes((i % 256, 0)) for i in range(10240)))  # ids 0..255, u16 LE
    p, lines = start_train(adjsh, [*MODEL, "--checkpoint-dir", os.path.join(tmp, "inp"),
                                   "--metrics-listen", "127.0.0.1:0", "--val-data", val,
                                   "--eval-every", "1", "--eval-tokens", "2048"])
    try:
        end, text = time.time() + 60, ""
        while time.time() < end and p.poll() is None:
            addrs = [l.split()[-1] for l in list(lines) if l.startswith("metrics on ")]
            if addrs:
                text = scrape(addrs[0])
                if (value(text, "adjsh_coordinator_steps_total") or 0) >= 2 and \
                        value(text, "adjsh_coordinator_val_loss") is not None:
                    break
            time.sleep(0.2)
        check(all(value(text, n) is not None for n in (
            "adjsh_coordinator_loss", "adjsh_coordinator_grad_norm",
            "adjsh_coordinator_learning_rate", "adjsh_coordinator_val_loss",
            "adjsh_coordinator_resident_memory_bytes")) and 'job_id="train"' in text and
              "adjsh_coordinator_tasks" not in text and
              "adjsh_coordinator_workers_connected" not in text,
              "adjsh train in-process --metrics-listen: loss, grad norm, lr, val loss, memory; "
              "no task or worker families")
    finally:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def final_weights(adjsh, ckpt, extra):
    short = [a if a != "100000" else "4" for a in MODEL]  # 4 steps
    r = subprocess.run([adjsh, "train", *short, "--workers", "2", "--checkpoint-dir", ckpt, *extra],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        print(r.stderr)
        return None
    with open(os.path.join(ckpt, "latest")) as f:
        with open(os.path.join(ckpt, f.read().strip(), "model.safetensors"), "rb") as m:
            return m.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    adjsh = os.path.abspath(ap.parse_args().adjsh)
    with tempfile.TemporaryDirectory(prefix="adjsh-metrics-cli-") as tmp:
        plain = final_weights(adjsh, os.path.join(tmp, "plain"), [])
        observed = final_weights(adjsh, os.path.join(tmp, "observed"),
                                 ["--metrics-listen", "127.0.0.1:0",
                                  "--worker-metrics-listen", "127.0.0.1:0"])
        check(plain is not None and plain == observed,
              "adjsh train --workers 2: bitwise the same weights with metrics served")
        _, workers = train_with_metrics(adjsh, tmp, "127.0.0.1:0")
        train_in_process_metrics(adjsh, tmp)
        base = two_free_ports()
        _, workers = train_with_metrics(adjsh, tmp, f"127.0.0.1:{base}")
        check(workers == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"],
              f"--worker-metrics-listen 127.0.0.1:{base}: workers on {workers}")

        def run(*args):
            return subprocess.run([adjsh, *args], capture_output=True, text=True, timeout=60)

        for args, code, text in [
            (["coordinator", "--insecure-local", "--metrics-listen", "nowhere"], 2, "--metrics-listen must be HOST:PORT"),
            (["worker", "--coordinator", "127.0.0.1:1", "--metrics-listen", "127.0.0.1:99999"], 2,
             "--metrics-listen must be HOST:PORT"),
            (["train", "--metrics-listen", "nowhere"], 2, "--metrics-listen must be HOST:PORT"),
            (["train", "--workers", "1", "--worker-metrics-listen", "127.0.0.1"], 2,
             "--worker-metrics-listen must be HOST:PORT"),
        ]:
            r = run(*args)
            check(r.returncode == code and text in r.stderr,
                  f"adjsh {' '.join(args)}: exit {r.returncode}, {r.stderr.strip()}")
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            for args in (["worker", "--coordinator", "127.0.0.1:1"],
                         ["coordinator", "--listen", "127.0.0.1:0", "--insecure-local",
                          "--state-dir", os.path.join(tmp, "state")]):
                r = run(*args, "--metrics-listen", f"127.0.0.1:{port}")
                check(r.returncode == 1 and "cannot serve metrics on" in r.stderr,
                      f"adjsh {args[0]} on a taken metrics port: exit {r.returncode}, "
                      f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
