#!/usr/bin/env python3
"""Load: 32 `adjsh worker` processes on loopback through a job of many small tasks.

  test_load.py --adjsh build/cli/adjsh [--workers 32] [--steps 8] [--json FILE]

The job: D=8, K=4, N=4, context 8192, chunk 32, 64 spans (per layer 63 + 64 forward and
63 + 64 backward span tasks: 1016 tasks per step), 8 steps,
through `adjsh coordinator` and the job API. Checks:
  * the final weights and optimizer state are bitwise those of `adjsh train --workers 1` with
    the same settings (no task lost or counted twice);
  * the results the workers had accepted (their `stopped:` lines: tasks done minus not
    accepted) add up to exactly 1016 x 8;
  * resident memory is steady: each process's RSS, sampled every 0.25 s, peaks at most
    max(4 MiB, 10 %) higher over steps 3 to 8 than in step 2 (the first step warms every cache
    and allocator arena; growth after it would be a leak per step: 4 MiB over the 6 steps
    after step 2 is 0.7 KiB per task).
Prints the RSS table (per step: coordinator, workers' min / median / max), the task counts and
the wall time; --json writes them too. Every process runs on 127.0.0.1 and is stopped at the end.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import Cluster, Results, final_files, guarded, rss_bytes, wait_for  # noqa: E402

SPANS = 64
TASKS_PER_STEP = 4 * (4 * SPANS - 2)  # K x (S - 1 + S + S - 1 + S)
SHAPE = {"hidden_size": 8, "layers": 4, "state_size": 4, "vocab_size": 256}
TRAIN_FLAGS = ["--hidden-size", "8", "--layers", "4", "--state-size", "4", "--context", "8192",
               "--chunk", "32", "--spans", str(SPANS), "--checkpoint-every", "0"]
STEPS = 8  # --steps (a leak of 1 MiB a step shows as 6 MiB over steps 2 to 8)
MIB = 1048576.0


def main():
    global STEPS
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--json", help="write the measured figures here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    STEPS = args.steps
    adjsh = os.path.abspath(args.adjsh)
    tmp = tempfile.mkdtemp(prefix="adjsh_load_")
    res = Results()
    cluster = Cluster(adjsh, tmp)
    guarded(cluster, res, lambda: body(adjsh, tmp, cluster, res, args))
    code = res.summary()
    if args.keep or code != 0:
        print("files kept in", tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return code


def body(adjsh, tmp, cluster, res, args):
    t0 = time.time()
    ref_dir = os.path.join(tmp, "one_worker")
    r = subprocess.run([adjsh, "train", *TRAIN_FLAGS, "--steps", str(STEPS), "--workers", "1",
                        "--checkpoint-dir", ref_dir], capture_output=True, text=True, timeout=900)
    one_worker_s = time.time() - t0
    ref = final_files(ref_dir)
    res.record(f"the 1-worker run ({one_worker_s:.1f} s)", r.returncode == 0 and ref, r.stderr)

    coord, addr = cluster.coordinator(os.path.join(tmp, "state"), lease_ms=5000)
    if not res.record("coordinator started", addr):
        return
    workers = [cluster.worker(addr, f"w{k:02d}", log="") for k in range(args.workers)]
    # Every worker registered (its log says so) before the job starts.
    logs = [cluster.log_path(f"worker-w{k:02d}") for k in range(args.workers)]
    ready = wait_for(lambda: all("registered" in open(p, errors="replace").read() for p in logs),
                     120, 0.2)
    res.record(f"{args.workers} workers registered", ready)

    samples = []  # (seconds since submit, step, {pid: rss})
    pids = [coord.pid] + [w.pid for w in workers]
    step = [0]
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            samples.append((time.time() - start, step[0], {p: rss_bytes(p) for p in pids}))
            stop.wait(0.25)

    ckpt = os.path.join(tmp, "job")
    start = time.time()
    job, r = cluster.submit(addr, {"init": SHAPE, "context_length": 8192, "chunk": 32,
                                   "spans": SPANS,
                                   "steps": STEPS, "checkpoint_every": 0,
                                   "checkpoint_dir": ckpt})
    if not res.record("job submitted", job, r.stderr):
        return
    t = threading.Thread(target=sampler, daemon=True)
    t.start()
    # `watch` prints a line per finished step: the sampler tags samples with the step running.
    w = subprocess.Popen([adjsh, "watch", "--coordinator", addr, "--job", job],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    for line in w.stdout:
        out.append(line)
        m = re.search(rf"{job} step (\d+)/{STEPS}", line)
        if m:
            step[0] = int(m.group(1))
    w.wait(timeout=600)
    wall = time.time() - start
    stop.set()
    t.join()
    res.record(f"job SUCCEEDED with {args.workers} workers in {wall:.1f} s",
               w.returncode == 0, "".join(out)[-1500:] + w.stderr.read())
    res.record("final weights and optimizer state bitwise equal to the 1-worker run",
               ref is not None and final_files(ckpt) == ref)

    # Tasks accepted, from each worker's own count when it stops.
    for p in workers:
        p.terminate()
    for p in workers:
        p.wait(timeout=30)
    done = refused = dropped = 0
    per_worker = []
    for p in logs:
        m = re.search(r"stopped: (\d+) tasks done \((\d+) not accepted\), (\d+) dropped",
                      open(p, errors="replace").read())
        if m:
            d, n, x = map(int, m.groups())
            done, refused, dropped = done + d, refused + n, dropped + x
            per_worker.append(d - n)
    want = STEPS * TASKS_PER_STEP
    res.record(f"results accepted: {done - refused} = {STEPS} x {TASKS_PER_STEP} "
               f"({done} pushed, {refused} refused, {dropped} dropped; per worker "
               f"{min(per_worker, default=0)}..{max(per_worker, default=0)})",
               len(per_worker) == len(workers) and done - refused == want)

    # Resident memory per step.
    table = []
    for s in range(STEPS + 1):
        rows = [rss for (_, st, rss) in samples if st == s]
        if not rows:
            continue
        coord_max = max((r[coord.pid] or 0) for r in rows)
        wk = [max((r[w.pid] or 0) for r in rows) for w in workers]
        table.append({"step": s + 1, "samples": len(rows),
                      "coordinator_mib": round(coord_max / MIB, 1),
                      "worker_min_mib": round(min(wk) / MIB, 1),
                      "worker_median_mib": round(statistics.median(wk) / MIB, 1),
                      "worker_max_mib": round(max(wk) / MIB, 1)})
    print("step  samples  coordinator MiB  workers MiB (min / median / max), peak in the step")
    for row in table:
        if row["step"] <= STEPS:
            print(f"{row['step']:>4}  {row['samples']:>7}  {row['coordinator_mib']:>15}  "
                  f"{row['worker_min_mib']} / {row['worker_median_mib']} / "
                  f"{row['worker_max_mib']}")
    # Each process's peak in step 2 (st == 1: one step done, everything allocated once)
    # against its peaks in the later steps. Not step 2's first sample: the coordinator's RSS
    # moves 2-3 MiB up and down within and between steps, with no trend over 12 steps, and a
    # low first sample made a steady process look 4 MiB larger.
    growth = {}
    for pid in pids:
        first = [r[pid] for (_, st, r) in samples if st == 1 and r[pid]]
        later = [r[pid] for (_, st, r) in samples if 1 < st < STEPS and r[pid]]
        if first and later:
            growth[pid] = (max(first), max(later))
    worst = max(growth.items(), key=lambda kv: kv[1][1] - kv[1][0], default=None)
    ok = bool(growth) and all(b - a <= max(4 * MIB, 0.1 * a) for a, b in growth.values())
    res.record("RSS steady after the first step: growth <= max(4 MiB, 10 %) for every process "
               f"(largest: pid {worst[0] if worst else '?'}, "
               f"{(worst[1][1] - worst[1][0]) / MIB if worst else 0:.2f} MiB)", ok,
               {p: (a / MIB, b / MIB) for p, (a, b) in growth.items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workers": args.workers, "tasks_per_step": TASKS_PER_STEP,
                       "steps": STEPS, "wall_s": round(wall, 1),
                       "one_worker_wall_s": round(one_worker_s, 1),
                       "results_accepted": done - refused, "results_refused": refused,
                       "rss_by_step": table}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
