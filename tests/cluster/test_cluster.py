#!/usr/bin/env python3
"""Local cluster: `adjsh train --workers N` (a coordinator and N worker processes on loopback).

  test_cluster.py --adjsh build/cli/adjsh

Checks, on a small model:
  * one gradient (`adjsh grad --workers N`) is bitwise the in-process one for N = 1, 2, 4,
    and with bf16 storage for N = 2;
and trained for a few steps on the built-in corpus:
  * the final weights and optimizer state are bitwise identical for in-process training and for
    1, 2 and 4 worker processes;
  * the same when worker processes are SIGKILLed at random points of the run (each is started
    again by the coordinator; a killed worker's task is handed out again when its lease ends);
  * the same when the coordinator process itself is SIGKILLed and the run is started again
    (it resumes from its last checkpoint; its workers die with it).
The cluster talks over a Unix socket in a private directory (no TCP). Prints `N passed, N failed`.
"""
import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import children, final_files  # noqa: E402

MODEL = ["--hidden-size", "32", "--layers", "3", "--state-size", "8", "--context", "2048",
         "--chunk", "64", "--warmup", "2", "--lr", "1e-2", "--threads", "1"]


def train(adjsh, ckpt, workers, steps, extra=(), timeout=600):
    cmd = [adjsh, "train", *MODEL, "--steps", str(steps), "--checkpoint-dir", ckpt,
           "--checkpoint-every", "2", "--workers", str(workers), "--lease-ms", "400", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    args = ap.parse_args()
    adjsh = os.path.abspath(args.adjsh)
    tmp = tempfile.mkdtemp(prefix="adjsh_cluster_")
    # The clusters' socket directories go here too: a SIGKILLed coordinator cannot remove its own.
    os.environ["TMPDIR"] = tmp
    results = []

    def record(name, ok, detail=""):
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}",
              flush=True)

    # One gradient: adjsh grad --workers N writes the same bytes as in-process.
    model = os.path.join(tmp, "model")
    tokens = os.path.join(tmp, "tokens.u16")
    subprocess.run([adjsh, "init", "--out", model, "--hidden-size", "32", "--layers", "3",
                    "--state-size", "8", "--vocab-size", "256"], check=True, capture_output=True)
    subprocess.run([adjsh, "tokenize", "--text", "/usr/share/common-licenses/GPL-3", "--out",
                    tokens, "--length", "3000"], check=True, capture_output=True)
    grads = {}
    for n in (0, 1, 2, 4):
        out = os.path.join(tmp, f"grad{n}.safetensors")
        r = subprocess.run([adjsh, "grad", "--model", model, "--tokens", tokens, "--out", out,
                            "--chunk", "100", "--workers", str(n), "--quiet"],
                           capture_output=True, text=True, timeout=600)
        grads[n] = open(out, "rb").read() if r.returncode == 0 else None
        if n:
            record(f"adjsh grad --workers {n}: gradient file bitwise equal to in-process",
                   grads[n] is not None and grads[n] == grads[0], r.stderr[-2000:])

    # bf16 storage: the coordinator keeps and sends layer inputs and states as bf16.
    for n in (0, 2):
        out = os.path.join(tmp, f"grad_bf16_{n}.safetensors")
        r = subprocess.run([adjsh, "grad", "--model", model, "--tokens", tokens, "--out", out,
                            "--chunk", "100", "--storage", "bf16", "--workers", str(n),
                            "--quiet"], capture_output=True, text=True, timeout=600)
        grads[f"bf16_{n}"] = open(out, "rb").read() if r.returncode == 0 else None
        if n:
            record(f"adjsh grad --storage bf16 --workers {n}: bitwise equal to in-process",
                   grads[f"bf16_{n}"] is not None and grads[f"bf16_{n}"] == grads["bf16_0"],
                   r.stderr[-2000:])
    record("adjsh grad --storage bf16 differs from f32 storage (the rounding is real)",
           grads["bf16_0"] is not None and grads["bf16_0"] != grads[0])

    steps = 8
    ref_dir = os.path.join(tmp, "inprocess")
    r = train(adjsh, ref_dir, 0, steps)
    record("in-process training", r.returncode == 0, r.stderr[-2000:])
    ref = final_files(ref_dir) if r.returncode == 0 else None

    for n in (1, 2, 4):
        d = os.path.join(tmp, f"workers{n}")
        r = train(adjsh, d, n, steps)
        ok = r.returncode == 0 and ref is not None and final_files(d) == ref
        record(f"{n} worker process(es): weights and optimizer state bitwise equal to in-process",
               ok, r.stderr[-2000:])

    # Workers SIGKILLed at random points; the coordinator starts them again.
    d = os.path.join(tmp, "kills")
    cmd = [adjsh, "train", *MODEL, "--steps", str(steps), "--checkpoint-dir", d,
           "--checkpoint-every", "2", "--workers", "2", "--lease-ms", "400"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rng = random.Random(7)
    kills = 0
    deadline = time.time() + 300
    while p.poll() is None and time.time() < deadline and kills < 8:
        time.sleep(rng.uniform(0.02, 0.1))
        kids = children(p.pid)
        if kids:
            try:
                os.kill(rng.choice(kids), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass  # it ended (and was reaped) after the listing: not a kill
    out, err = p.communicate(timeout=300)
    ok = p.returncode == 0 and kills >= 3 and ref is not None and final_files(d) == ref
    record(f"workers SIGKILLed {kills} times mid-run: final state bitwise equal", ok, err[-2000:])

    # The coordinator SIGKILLed mid-run, then started again: it resumes from its checkpoint.
    d = os.path.join(tmp, "coordinator_kill")
    p = subprocess.Popen(cmd[:cmd.index("--checkpoint-dir") + 1] + [d] +
                         cmd[cmd.index("--checkpoint-dir") + 2:],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = False
    while p.poll() is None and time.time() < deadline:
        if os.path.exists(os.path.join(d, "latest")):
            p.kill()
            killed = True
            break
        time.sleep(0.05)
    p.communicate(timeout=60)
    r = train(adjsh, d, 2, steps)
    ok = killed and r.returncode == 0 and "resumed" in r.stderr and ref is not None and \
        final_files(d) == ref
    record("coordinator SIGKILLed after a checkpoint and restarted: final state bitwise equal",
           ok, r.stderr[-2000:])

    npass = sum(results)
    print(f"{npass} passed, {len(results) - npass} failed")
    if npass == len(results):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"files kept in {tmp}")
    return 0 if npass == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
