#!/usr/bin/python3
"""Host-device traffic of one gradient step with the CUDA backend (build/bench/emulated_step,
counted on the host-emulated device, kernels skipped, so no GPU is needed): both model types at
D=256, K=4, V=50,280, T = 64K and 256K, one device owning every span (the in-process span step,
what one GPU worker owning the step runs). Writes the table into docs/BENCHMARKS.md between the
`traffic` markers, and prints it.

  bench/traffic_benchmarks.py [--binary build/bench/emulated_step] [--no-write]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from claims_common import replace_section  # noqa: E402
from machine import describe  # noqa: E402

SHAPE = ["--hidden-size", "256", "--layers", "4", "--vocab-size", "50280", "--chunk", "256"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "bench", "emulated_step"))
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    a = ap.parse_args()
    if not os.access(a.binary, os.X_OK):
        sys.exit(f"traffic_benchmarks: no {a.binary} (a CUDA build: scripts/build.sh)")
    rows = []
    for model in ("mamba", "mamba2"):
        for T in (65536, 262144):
            print(f"  {model} T={T} ...", file=sys.stderr, flush=True)
            p = subprocess.run([a.binary, "--model-type", model, "--tokens", str(T), *SHAPE],
                               capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"traffic_benchmarks: {model} T={T}: {p.stderr.strip()}")
            rows.append(json.loads(p.stdout))
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    lines = [f"{describe()}; {when} UTC; code {commit}. The design as it is: every call uploads "
             "its rows and downloads its outputs and syncs; the backward keeps a task's gradient "
             "sum on the device (up and down once per task); the head uploads the embedding "
             "per call.", "",
             "| model | T | spans | tasks | H2D B/token | D2H B/token | beyond one parameter "
             "upload and one gradient download, B/token | syncs per task | copies | "
             "allocations |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = "Mamba-1" if r["model"] == "mamba" else "Mamba-2"
        lines.append(
            f"| {name} | {r['T'] // 1024}K | {r['spans']} | {r['tasks']} | "
            f"{r['h2d_per_token']:,.0f} | {r['d2h_per_token']:,.0f} | "
            f"{r['beyond_params_and_grad_per_token']:,.0f} | {r['syncs_per_task']:.1f} | "
            f"{r['h2d_copies'] + r['d2h_copies']:,} | {r['allocations']} |")
    lines += ["", "The goal of the resident design (issue 49): at most 64 B/token beyond one "
              "parameter upload and one gradient download per step, at most 1 sync per task."]
    body = "\n".join(lines)
    print(body)
    if not a.no_write:
        replace_section("traffic", "Host-device traffic of a GPU step",
                        "bench/traffic_benchmarks.py", body)


if __name__ == "__main__":
    main()
