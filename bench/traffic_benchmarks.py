#!/usr/bin/python3
"""Host-device traffic of one gradient step with the CUDA backend (build/bench/emulated_step,
counted on the host-emulated device, kernels skipped, so no GPU is needed): both model types at
D=256, K=4, V=50,280, T = 64K (the plan's spans and 4), 128K and 256K, one device owning every
span (the in-process span
step, what one GPU worker owning the step runs), with the device memory the step held at its
peak. Writes the table into docs/BENCHMARKS.md between the
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
        # The plan's spans at each T, and 64K again with 4 spans (half the boundaries).
        for T, spans in ((65536, 0), (65536, 4), (131072, 0), (262144, 0)):
            print(f"  {model} T={T} ...", file=sys.stderr, flush=True)
            p = subprocess.run([a.binary, "--model-type", model, "--tokens", str(T), "--spans",
                                str(spans), *SHAPE], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"traffic_benchmarks: {model} T={T}: {p.stderr.strip()}")
            rows.append(json.loads(p.stdout))
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    lines = [f"{describe()}; {when} UTC; code {commit}. The resident design: a span's rows, "
             "states and cotangents stay on the device, the embedding and head are uploaded "
             "once per model, the partials are summed on the device in the ledger's tree and "
             "each group's root comes down once; what crosses per task is its (layer, span) "
             "summaries (states, halo rows), and the span's token ids go up once.", "",
             "| model | T | spans | tasks | H2D B/token | D2H B/token | beyond one parameter "
             "upload and one gradient download, B/token | syncs per task (most in one) | copies "
             "| allocations | device peak MiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = "Mamba-1" if r["model"] == "mamba" else "Mamba-2"
        lines.append(
            f"| {name} | {r['T'] // 1024}K | {r['spans']} | {r['tasks']} | "
            f"{r['h2d_per_token']:,.0f} | {r['d2h_per_token']:,.0f} | "
            f"{r['beyond_params_and_grad_per_token']:,.0f} | {r['syncs_per_task']:.2f} "
            f"({r['most_syncs_in_a_task']}) | {r['h2d_copies'] + r['d2h_copies']:,} | "
            f"{r['allocations']} | {r['device_peak_bytes'] / 2**20:,.0f} |")
    lines += ["", "The goal (issue 49): at most 64 B/token beyond one parameter upload and one "
              "gradient download per step, at most 1 sync per task. Syncs beyond the tasks' are "
              "the step's own (making the model, bringing each group's root down). What is "
              "left is what crosses at each span boundary, per layer: the four states the "
              "ledger combines on the host (a forward summary and a backward summary down, the "
              "boundary state and adjoint up: 32 KiB each here), the forward's delta sums and "
              "four (W - 1)-row halos, about 8.9 B/token per boundary at 64K (62 with 8 spans' "
              "7 boundaries), and the span's token ids, once (4 B/token). The goal is met at "
              "64K with up to 7 spans and at 128K and 256K with the plan's; with 8 spans at 64K "
              "it would need the ledger's combination on the device or the halos kept there."]
    body = "\n".join(lines)
    print(body)
    if not a.no_write:
        replace_section("traffic", "Host-device traffic of a GPU step",
                        "bench/traffic_benchmarks.py", body)


if __name__ == "__main__":
    main()
