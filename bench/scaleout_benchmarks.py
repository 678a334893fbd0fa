#!/usr/bin/python3
"""Scale-out of one exact gradient by spans: `adjsh grad` in-process (1 thread) against local
worker processes (one task at a time each), with the coordinator's own figures.

  /usr/bin/python3 bench/scaleout_benchmarks.py [--build build] [--quick] [--json FILE]
      [--trace-dir DIR]

Model D=128, K=4, N=16, V=256 (a fresh one), tokens of the built-in corpus, chunk 1024 (4096 at
T = 1M), the default spans (about T/16384, at least 8). Each row is one gradient:
  seconds      `adjsh grad`'s own time of the gradient (model and tokens loaded before)
  speed-up     the in-process 1-thread run of the same T over this row, both in this run
  wire B/tok   tensor bytes in and out of the coordinator per token (the coordinator's summary)
  coord MiB    peak RSS of the `adjsh grad` process (coordinator: tokens, parameters, ledger)
  worker MiB   peak RSS of each worker process (their `stopped:` lines), max over workers
  parallelism  the coordinator's task seconds over the critical path of the step
  reduce       tree (the workers sum the partials among themselves, the default) or star
               (every partial through the coordinator): the same bits, other wire bytes
The peak RSS slope in T of the coordinator and of one worker is fitted between the 64K and
256K rows (and 1M when run). Every process runs on this machine's 2 cores: a row with more
workers than cores shows the protocol's overhead, not parallel speed. --quick skips T = 1M.
--trace-dir keeps each run's task trace (adjsh grad --trace) for bench/fleet_sim.py.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = "/usr/share/common-licenses/GPL-3"
GRAD = re.compile(r"loss ([\d.]+)\s+tokens (\d+)\s+([\d.]+) s .* peak RSS ([\d.]+) MiB")
PROFILE = re.compile(r"(\d+) tasks on (\d+) spans \| ([\d.]+) s of tasks, critical path "
                     r"([\d.]+) s, parallelism ([\d.]+) \| wire ([\d.]+) MB")
WORKER_PEAK = re.compile(r"stopped: \d+ tasks done .* peak RSS ([\d.]+) MiB")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return p.stderr


def grad(adjsh, model, tokens, work, chunk, workers, threads, reduce, trace=None):
    out = os.path.join(work, "g.safetensors")
    cmd = [adjsh, "grad", "--model", model, "--tokens", tokens, "--out", out, "--chunk",
           str(chunk), "--threads", str(threads), "--workers", str(workers), "--reduce", reduce]
    if trace:
        cmd += ["--trace", trace]
    err = run(cmd)
    g = GRAD.search(err)
    p = PROFILE.search(err)
    if not g or not p:
        sys.exit(f"no summary in the output of {' '.join(cmd)}:\n{err[-2000:]}")
    peaks = [float(m.group(1)) for m in WORKER_PEAK.finditer(err)]
    T = int(g.group(2))
    if workers and ("tree of " in err) != (reduce == "tree"):
        sys.exit(f"--reduce {reduce} did not run as asked: {err[-800:]}")
    return {"T": T, "workers": workers, "threads": threads, "reduce": reduce if workers else "-",
            "seconds": float(g.group(3)),
            "loss": float(g.group(1)), "coord_mib": float(g.group(4)),
            "worker_mib": max(peaks) if peaks else None, "tasks": int(p.group(1)),
            "spans": int(p.group(2)), "task_s": float(p.group(3)),
            "critical_s": float(p.group(4)), "parallelism": float(p.group(5)),
            "wire_b_per_token": float(p.group(6)) * 1e6 / T if workers else 0.0}


def slope(rows, key, workers):
    pts = sorted((r["T"], r[key]) for r in rows
                 if r["workers"] == workers and r["reduce"] != "star" and r[key])
    if len(pts) < 2:
        return None
    (t0, m0), (t1, m1) = pts[0], pts[-1]
    return (m1 - m0) * 1048576 / (t1 - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true", help="skip T = 1M")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--trace-dir", help="keep the task traces here")
    args = ap.parse_args()
    adjsh = os.path.join(args.build, "cli", "adjsh")
    if not os.access(adjsh, os.X_OK):
        sys.exit(f"{adjsh} not found: build first (scripts/build.sh)")
    work = tempfile.mkdtemp(prefix="adjsh_scaleout_")
    model = os.path.join(work, "model")
    run([adjsh, "init", "--out", model, "--hidden-size", "128", "--layers", "4",
         "--vocab-size", "256", "--seed", "1"])
    # (T, chunk, [(workers, threads, reduce)])
    plan = [(16384, 1024, [(4, 1, "tree"), (4, 1, "star")]),
            (65536, 1024, [(0, 1, "tree"), (2, 1, "tree"), (2, 1, "star"), (4, 1, "tree"),
                           (4, 1, "star"), (1, 1, "tree")]),
            (262144, 1024, [(0, 1, "tree"), (4, 1, "tree"), (4, 1, "star"), (2, 1, "tree"),
                            (2, 1, "star"), (1, 1, "tree")])]
    if not args.quick:
        plan.append((1048576, 4096, [(4, 1, "tree")]))
    rows = []
    for T, chunk, runs in plan:
        tokens = os.path.join(work, f"t{T}.u32")
        run([adjsh, "tokenize", "--text", CORPUS, "--out", tokens, "--length", str(T)])
        for workers, threads, reduce in runs:
            trace = None
            if args.trace_dir:
                os.makedirs(args.trace_dir, exist_ok=True)
                suffix = "_star" if reduce == "star" and workers else ""
                trace = os.path.join(args.trace_dir, f"T{T}_W{workers}{suffix}.jsonl")
                if os.path.exists(trace):
                    os.remove(trace)
            r = grad(adjsh, model, tokens, work, chunk, workers, threads, reduce, trace)
            rows.append(r)
            print(f"T={T:>8} workers={workers} {r['reduce']:4} {r['seconds']:8.2f} s  "
                  f"par {r['parallelism']:5.1f}"
                  f"  wire {r['wire_b_per_token']:7.1f} B/tok  coord {r['coord_mib']:7.1f} MiB"
                  f"  worker {r['worker_mib'] or 0:7.1f} MiB", flush=True)
    base = {r["T"]: r["seconds"] for r in rows if r["workers"] == 0}
    print("\n| T | chunk | spans | workers | reduce | seconds | speed-up vs in-process 1 thread | "
          "parallelism | wire B/token | coordinator peak MiB | worker peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    chunks = {T: c for T, c, _ in plan}
    for r in rows:
        sp = f"{base[r['T']] / r['seconds']:.2f}x" if r["T"] in base else "-"
        print(f"| {r['T']:,} | {chunks[r['T']]} | {r['spans']} | "
              f"{r['workers'] or 'in-process'} | {r['reduce']} | {r['seconds']:.2f} | {sp} | "
              f"{r['parallelism']:.1f} | {r['wire_b_per_token']:.0f} | {r['coord_mib']:.1f} | "
              f"{r['worker_mib'] if r['worker_mib'] else '-'} |")
    for w in (1, 2, 4):
        c, k = slope(rows, "coord_mib", w), slope(rows, "worker_mib", w)
        if c is not None:
            print(f"\n{w} workers: coordinator RSS slope {c:.1f} B/token, worker RSS slope "
                  f"{k:.1f} B/token (64K to the largest T)" if k is not None else "")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
