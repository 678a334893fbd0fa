#!/usr/bin/python3
"""Host-device traffic of one gradient step with the CUDA backend, counted on the host-emulated
device with its kernels skipped (no GPU needed): both model types at D=256, K=4, V=50,280,
T = 64K (the plan's spans and 4), 128K and 256K, one device owning every span (the in-process
span step: build/bench/emulated_step), with the device memory the step held at its peak; 64K
again with a 64 MiB budget for the span rows (the rest spilled to pinned host memory); then at
64K one GPU worker process owning every span through a coordinator (`grad --workers 1` of
build/tests/cuda/adjsh_emulated_gpu, which prints its device's copied bytes at exit). Writes the
tables into docs/BENCHMARKS.md between the `traffic` markers, and prints them.

  bench/traffic_benchmarks.py [--binary build/bench/emulated_step]
                              [--gpu-cli build/tests/cuda/adjsh_emulated_gpu] [--no-write]
"""
import argparse
import datetime
import json
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

MODEL = ["--hidden-size", "256", "--layers", "4", "--vocab-size", "50280"]
CHUNK = ["--chunk", "256"]
BUDGET = 64 << 20  # bytes: the span rows' device budget of the spilled run
SHAPE = [*MODEL, *CHUNK]  # emulated_step's flags
COPIED = re.compile(r"worker: cuda:0 copied (\d+) B to the device and (\d+) B back "
                    r"\((\d+) copies, (\d+) syncs\)")


def worker_step(cli, model_type, T, spans, param_bytes):
    """One GPU worker's step through a coordinator: (h2d, d2h, syncs) its device counted."""
    with tempfile.TemporaryDirectory(prefix="adjsh-traffic-") as tmp:
        model, tokens = os.path.join(tmp, "model"), os.path.join(tmp, "tokens.u16")
        # emulated_step's models: Mamba-1 tied, Mamba-2 with an LM head of its own.
        init = [cli, "init", "--out", model, "--model-type", model_type, *MODEL,
                *(["--untied-head"] if model_type == "mamba2" else [])]
        r = subprocess.run(init, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"traffic_benchmarks: init: {r.stderr.strip()}")
        write_random_tokens(tokens, T, 50280)
        env = dict(os.environ, ADJSH_EMULATION_SKIP_KERNELS="1")
        r = subprocess.run([cli, "grad", "--model", model, "--tokens", tokens, *CHUNK,
                            "--spans", str(spans), "--workers", "1", "--worker-device", "cuda:0",
                            "--quiet", "--out", os.path.join(tmp, "grad.safetensors")],
                           capture_output=True, text=True, env=env, timeout=1800)
        m = COPIED.search(r.stderr)
        if r.returncode != 0 or m is None:
            sys.exit(f"traffic_benchmarks: {model_type} worker: {r.stderr.strip()[-2000:]}")
        h2d, d2h, _, syncs = (int(x) for x in m.groups())
        return h2d, d2h, syncs, (h2d + d2h - 2 * param_bytes) / T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "bench", "emulated_step"))
    ap.add_argument("--gpu-cli",
                    default=os.path.join(ROOT, "build", "tests", "cuda", "adjsh_emulated_gpu"))
    ap.add_argument("--no-write", action="store_true", help="print the tables only")
    a = ap.parse_args()
    for path in (a.binary, a.gpu_cli):
        if not os.access(path, os.X_OK):
            sys.exit(f"traffic_benchmarks: no {path} (a CUDA build: scripts/build.sh)")
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
    # 64K again with the span rows' budget at 64 MiB: what spills comes back by copies ahead.
    budgeted = []
    for r in rows:
        if r["T"] == 65536 and r["spans"] != 4:
            print(f"  {r['model']} T=65536, --row-budget-bytes {BUDGET} ...", file=sys.stderr,
                  flush=True)
            p = subprocess.run([a.binary, "--model-type", r["model"], "--tokens", "65536",
                                "--spans", str(r["spans"]), "--row-budget-bytes", str(BUDGET),
                                *SHAPE], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"traffic_benchmarks: {r['model']} budget: {p.stderr.strip()}")
            budgeted.append((r, json.loads(p.stdout)))
    workers = []
    for r in rows:
        if r["T"] == 65536 and r["spans"] != 4:
            print(f"  {r['model']} T=65536, one GPU worker ...", file=sys.stderr, flush=True)
            workers.append((r, worker_step(a.gpu_cli, r["model"], 65536, r["spans"],
                                               r["param_bytes"])))
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
            f"{r['beyond_params_and_grad_per_token']:,.1f} | {r['syncs_per_task']:.2f} "
            f"({r['most_syncs_in_a_task']}) | {r['h2d_copies'] + r['d2h_copies']:,} | "
            f"{r['allocations']} | {r['device_peak_bytes'] / 2**20:,.0f} |")
    lines += ["", "The goal (issue 49): at most 64 B/token beyond one parameter upload and one "
              "gradient download per step, at most 1 sync per task. Syncs beyond the tasks' are "
              "the step's own (making the model, bringing each group's root down). What is "
              "left is what crosses at each span boundary, per layer: the four states the "
              "ledger combines on the host (a forward summary and a backward summary down, the "
              "boundary state and adjoint up: 32 KiB each here), the forward's delta sums and "
              "the (W - 1)-row conv halos, about 8.7 B/token per boundary at 64K (61 with 8 "
              "spans' 7 boundaries), and the span's token ids, once (2 B/token: 16 bits where "
              "the vocabulary fits, widened on the device).", "",
              "One GPU worker process owning every span of the 64K step, through a coordinator "
              "(its partials summed on its device by the worker tree, a tied model's head and "
              "lookup roots brought down as one; Mamba-1 is tied, Mamba-2 has an LM head of its "
              "own, as above): what its device counted over the whole run.",
              "", "| model | T | spans | H2D B/token | D2H B/token | beyond one parameter upload "
              "and one gradient download, B/token | syncs |", "|---|---|---|---|---|---|---|"]
    for r, (h2d, d2h, syncs, beyond) in workers:
        name = "Mamba-1" if r["model"] == "mamba" else "Mamba-2"
        lines.append(f"| {name} | {r['T'] // 1024}K | {r['spans']} | {h2d / r['T']:,.0f} | "
                     f"{d2h / r['T']:,.0f} | {beyond:,.1f} | {syncs} |")
    lines += ["", f"The 64K step again with the span rows' device budget at {BUDGET >> 20} MiB "
              "(`--row-budget-bytes`; `--device-mem-mib` of a worker): what grows with the spans "
              "past it is mapped pinned host memory, written in place by the kernels, and a "
              "chunk's stored rows come back by a copy on a second stream started while the "
              "chunk before is computed (kernels/cuda/device_row_space.h DeviceRowSpace::ReadRows). "
              "Each pass over a layer (forward summary, forward, backward summary, backward; "
              "Mamba-2 also rebuilds its chunk states once) reads each chunk's rows with their "
              "conv halo once; the bytes beyond the resident step are those copies.", "",
              "| model | spilled MiB (peak) | H2D B/token | beyond the resident step, B/token "
              "| copies | syncs per task (most in one) | device peak MiB |",
              "|---|---|---|---|---|---|---|"]
    for r, b in budgeted:
        name = "Mamba-1" if r["model"] == "mamba" else "Mamba-2"
        extra = (b["h2d_bytes"] - r["h2d_bytes"]) / b["T"]
        lines.append(f"| {name} | {b['mapped_peak_bytes'] / 2**20:,.0f} | "
                     f"{b['h2d_per_token']:,.0f} | {extra:,.0f} | "
                     f"{b['h2d_copies'] + b['d2h_copies']:,} | {b['syncs_per_task']:.2f} "
                     f"({b['most_syncs_in_a_task']}) | {b['device_peak_bytes'] / 2**20:,.0f} |")
    body = "\n".join(lines)
    print(body)
    if not a.no_write:
        replace_section("traffic", "Host-device traffic of a GPU step",
                        "bench/traffic_benchmarks.py", body)


if __name__ == "__main__":
    main()
