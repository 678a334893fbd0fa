#!/usr/bin/python3
"""Device memory per GPU worker against the tokens each one owns: `grad --workers W
--worker-device cuda:0` of a D=256, K=4, V=50,280 Mamba-1 model at T = 64K, 128K and 256K
(8 spans) for W = 1, 2 and 4, on the host-emulated GPU (build/tests/cuda/adjsh_emulated_gpu,
each worker process a GPU of its own) with the kernels skipped (ADJSH_EMULATION_SKIP_KERNELS=1:
the host code's allocations, the same as a GPU's, without computing what they hold). Each worker
says at its exit the most device memory it held (cli/worker_cmd.cc); the table gives the largest
and the smallest of the W, and a line through them its fixed part and its part per token owned;
then T = 256K again with --device-mem-mib 64, where the rows past the budget spill.
Writes it into docs/BENCHMARKS.md between the `worker-memory`
markers, and prints it.

  bench/worker_memory.py [--binary build/tests/cuda/adjsh_emulated_gpu] [--no-write]
"""
import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from claims_common import replace_section, write_random_tokens  # noqa: E402
from machine import describe  # noqa: E402

SHAPE = ["--hidden-size", "256", "--layers", "4", "--vocab-size", "50280"]
CHUNK, SPANS = 256, 8
BUDGET = 64  # MiB: --device-mem-mib of the budgeted rows
HELD = re.compile(r"worker: cuda:0 held at most ([0-9.]+) MiB of device memory")


def peaks(binary, model, tokens, workers, tmp, budget=None):
    """The device peaks (MiB) the W workers of one `grad --workers` said at their exit."""
    env = dict(os.environ, ADJSH_EMULATION_SKIP_KERNELS="1")
    extra = [] if budget is None else ["--device-mem-mib", str(budget)]
    p = subprocess.run([binary, "grad", "--model", model, "--tokens", tokens, "--chunk",
                        str(CHUNK), "--spans", str(SPANS), "--workers", str(workers),
                        "--worker-device", "cuda:0", "--quiet", *extra, "--out",
                        os.path.join(tmp, "grad.safetensors")],
                       capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"worker_memory: W={workers}: {p.stderr.strip()[-2000:]}")
    held = [float(m) for m in HELD.findall(p.stderr)]
    if len(held) != workers:
        sys.exit(f"worker_memory: W={workers}: {len(held)} of {workers} workers said their "
                 f"device peak:\n{p.stderr[-2000:]}")
    return held


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary",
                    default=os.path.join(ROOT, "build", "tests", "cuda", "adjsh_emulated_gpu"))
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    a = ap.parse_args()
    if not os.access(a.binary, os.X_OK):
        sys.exit(f"worker_memory: no {a.binary} (a CUDA build: scripts/build.sh)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="adjsh-worker-memory-") as tmp:
        model = os.path.join(tmp, "model")
        r = subprocess.run([a.binary, "init", "--out", model, *SHAPE], capture_output=True,
                           text=True)
        if r.returncode != 0:
            sys.exit(f"worker_memory: init: {r.stderr.strip()}")
        for T in (65536, 131072, 262144):
            tokens = os.path.join(tmp, f"tokens-{T}.u16")
            write_random_tokens(tokens, T, 50280)
            for W in (1, 2, 4):
                print(f"  T={T} W={W} ...", file=sys.stderr, flush=True)
                held = peaks(a.binary, model, tokens, W, tmp)
                rows.append((T, W, max(held), min(held)))
        # With a budget below what the rows of the longest context take: they spill.
        budgeted = []
        for W in (1, 2, 4):
            print(f"  T=262144 W={W} --device-mem-mib {BUDGET} ...", file=sys.stderr, flush=True)
            held = peaks(a.binary, model, tokens, W, tmp, budget=BUDGET)
            budgeted.append((262144, W, max(held), min(held)))
    # A line through (tokens per worker, largest peak): the fixed part and the part per token.
    xs = [T / W for T, W, _, _ in rows]
    ys = [hi for _, _, hi, _ in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fixed = my - slope * mx
    worst = max(abs(y - (fixed + slope * x)) for x, y in zip(xs, ys))
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    lines = [f"{describe()}; {when} UTC; code {commit}. Mamba-1, D=256, K=4, V=50,280, chunk "
             f"{CHUNK}, {SPANS} spans, counted on the host-emulated GPU (kernels skipped: the "
             "same allocations as a GPU's; a GPU also holds cuBLAS's 32 MiB workspace, which the "
             "emulated device does not).", "",
             "| T | workers | tokens per worker | device peak per worker, MiB (largest / "
             "smallest) |", "|---|---|---|---|"]
    for T, W, hi, lo in rows:
        lines.append(f"| {T // 1024}K | {W} | {T // W // 1024}K | {hi:,.0f} / {lo:,.0f} |")
    lines += ["", f"The peak follows the tokens a worker owns, whatever T: {fixed:,.0f} MiB "
              f"(the tied embedding, the layers, the workspace) plus "
              f"{slope * 1048576 / 1024:,.2f} KiB per token owned (each layer's input rows, "
              f"the span's states and adjoints), within {worst:,.0f} MiB of every row. The "
              "largest is the worker that owns span 0: its partials stay on its device for the "
              "worker tree (engine/tree_reduce.h), and the (V, D) ones waiting for a sibling "
              "(49 MiB each here; how many at once depends on the order its tasks end) and the "
              "head's root, which waits for the lookups' (a tied model's pair comes down as "
              "one), are held there.", "",
              f"With `--device-mem-mib {BUDGET}` what grows with the spans (rows, cotangents, "
              f"(V, D) partials) past {BUDGET} MiB is pinned host memory, its rows copied back "
              "a chunk ahead of the kernels that read them (kernels/cuda/cuda_backend.cc "
              "DeviceRowSpace): the device peak stays under the fixed part plus the budget (the "
              "same bits: tests/bench/test_emulated_step.py, "
              "tests/cuda/test_emulated_workers.py).", "",
              "| T | workers | tokens per worker | device peak per worker, MiB (largest / "
              f"smallest) | under the fixed part + {BUDGET} MiB |", "|---|---|---|---|---|"]
    for T, W, hi, lo in budgeted:
        under = "yes" if hi <= fixed + BUDGET + worst else "no"
        lines.append(f"| {T // 1024}K | {W} | {T // W // 1024}K | {hi:,.0f} / {lo:,.0f} | "
                     f"{under} |")
    table = "\n".join(lines)
    print(table)
    if not a.no_write:
        replace_section("worker-memory", "Device memory per GPU worker", "bench/worker_memory.py",
                        table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
