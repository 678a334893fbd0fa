#!/usr/bin/python3
"""A batch's sequences as more spans: `adjsh train --batch-size B --workers W` step time, with
the sequences of a step dealt over the workers together (coordinator/task_service.h
ComputeGradients), against the same run on one worker.

  /usr/bin/python3 bench/batch_benchmarks.py [--build build] [--context T] [--steps N]
      [--repeats R] [--json FILE]

Model D=128, K=4, N=16, V=256 (a fresh one), the built-in corpus, chunk 256, --spans S per
sequence. Each row is one `adjsh train` run; its step seconds are the median of its steps
after the first (the first fetches the model), from --log-jsonl:
  seconds/step  that median
  speed-up      the same B and S on one worker over this row, both in this run
  par           the steps' parallelism (task seconds over the longest chain of dependent
                tasks, engine/step_profile.h), from the progress line: what the dependencies
                allow at best
With one span a sequence a step of one sequence is a single chain, so a second worker cannot
help it (speed-up ~1); a batch of 2 is two chains, one per worker (speed-up up to 2 on this
machine's 2 cores: each worker process is pinned to a core). R repeats alternate the rows, and
the table gives each row's median over them.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAR = re.compile(r"\| par ([\d.]+) \|")


def train(adjsh, work, context, steps, batch, spans, workers):
    ck = tempfile.mkdtemp(prefix="ck_", dir=work)
    log = os.path.join(ck, "log.jsonl")
    cmd = [adjsh, "train", "--context", str(context), "--batch-size", str(batch), "--spans",
           str(spans), "--steps", str(steps), "--chunk", "256", "--workers", str(workers),
           "--checkpoint-dir", ck, "--checkpoint-every", "0", "--log-jsonl", log,
           "--worker-log-dir", os.path.join(ck, "logs"), "--seed", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    with open(log) as f:
        seconds = [json.loads(line)["seconds"] for line in f if line.strip()]
    pars = [float(m.group(1)) for m in PAR.finditer(p.stderr)]
    if len(seconds) != steps or not pars:
        sys.exit(f"no step log in the run of {' '.join(cmd)}:\n{p.stderr[-2000:]}")
    return {"batch": batch, "spans": spans, "workers": workers,
            "seconds": statistics.median(seconds[1:]), "parallelism": statistics.median(pars)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    adjsh = os.path.join(args.build, "cli", "adjsh")
    if not os.access(adjsh, os.X_OK):
        sys.exit(f"{adjsh} not found: build first (scripts/build.sh)")
    if args.steps < 2:
        sys.exit("--steps must be at least 2 (the first step is left out)")
    work = tempfile.mkdtemp(prefix="adjsh_batch_")
    # (batch, spans per sequence, workers)
    plan = [(1, 1, 1), (1, 1, 2), (2, 1, 1), (2, 1, 2), (2, 2, 1), (2, 2, 2), (4, 1, 1),
            (4, 1, 2)]
    runs = {key: [] for key in plan}
    for rep in range(args.repeats):
        for key in plan:
            r = train(adjsh, work, args.context, args.steps, *key)
            runs[key].append(r)
            print(f"repeat {rep + 1}: batch {key[0]} spans {key[1]} workers {key[2]}: "
                  f"{r['seconds']:.3f} s/step, par {r['parallelism']:.1f}", flush=True)
    rows = []
    for key in plan:
        rows.append({"batch": key[0], "spans": key[1], "workers": key[2],
                     "seconds": statistics.median(r["seconds"] for r in runs[key]),
                     "parallelism": statistics.median(r["parallelism"] for r in runs[key]),
                     "all_seconds": [r["seconds"] for r in runs[key]]})
    one = {(r["batch"], r["spans"]): r["seconds"] for r in rows if r["workers"] == 1}
    print(f"\n| batch | spans per sequence | workers | seconds/step | speed-up vs 1 worker | "
          f"par |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        sp = one[(r["batch"], r["spans"])] / r["seconds"]
        print(f"| {r['batch']} | {r['spans']} | {r['workers']} | {r['seconds']:.3f} | "
              f"{sp:.2f}x | {r['parallelism']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
