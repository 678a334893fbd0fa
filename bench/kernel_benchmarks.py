#!/usr/bin/python3
"""CPU kernel benchmarks: the scans and the block against this machine's limits, and where one
gradient's time goes.

  /usr/bin/python3 bench/kernel_benchmarks.py [--build build] [--seconds S] [--no-profile]

Runs, in one session on this machine:
  * bench/kernel_bench (1 thread, D=256, N=16, 256 rows): the vector FMA peak and the sgemm rate;
    the channel-blocked scans (forward, adjoint summary, backward) against the per-channel
    kernels they replaced, timed alternately on the same inputs; the block's forward and backward;
  * a profile of one gradient (bench/grad_bench, 1 thread, T = 16K, D=256, K=4, N=16) under
    `perf record` for the span schedule (adjsh's default) and the wavefront, its samples grouped
    into the kernels' parts (the median of 3 profiles each).
Writes the tables into docs/BENCHMARKS.md between the `kernels` markers, and prints them.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import machine  # bench/machine.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Symbol patterns of perf's report, in order: the first that matches names the part.
GROUPS = [
    ("our GEMMs: GemmPacked, GemmAtB (`kernels/cpu/gemm_packed.h`)", r"GemmPacked|GemmAtB|::Tile<"),
    ("OpenBLAS sgemm kernel + packing", r"sgemm_"),
    ("scans (`kernels/cpu/scan_block_impl.h`)", r"blocked::|Scan\w*Channel"),
    ("Mamba block element-wise (`MambaBlockCpu::Recompute`, `Forward`, `Backward`, summaries; "
     "RMSNorm)", r"MambaBlockCpu|RmsNorm|RowDot"),
    ("LM head", r"LmHead"),
    ("memset / memcpy", r"__mem(set|move|cpy)"),
    ("kernel (scheduler, page faults)", r"^\[k\]"),
]


def profile(build, schedule, work, runs=3):
    """Each part's median share over `runs` profiles (one profile's shares move by a few
    points with the machine's load)."""
    each = [profile_once(build, schedule, work) for _ in range(runs)]
    return {k: sorted(e[k] for e in each)[runs // 2] for k in each[0]}


def profile_once(build, schedule, work):
    data = os.path.join(work, f"perf-{schedule}.data")
    cmd = ["perf", "record", "-F", "2000", "-o", data, "--", f"{build}/bench/grad_bench",
           "--tokens", "16384", "--threads", "1", "--schedule", schedule]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "symbol",
                          "--stdio"], check=True, capture_output=True, text=True).stdout
    shares = {name: 0.0 for name, _ in GROUPS}
    shares["other"] = 0.0
    for line in rep.splitlines():
        m = re.match(r"\s+([0-9.]+)%\s+(\[[.k]\])\s+(.*)", line)
        if not m:
            continue
        pct, kind, sym = float(m.group(1)), m.group(2), m.group(3).strip()
        for name, pat in GROUPS:
            if re.search(pat, f"{kind} {sym}" if pat.startswith("^") else sym):
                shares[name] += pct
                break
        else:
            shares["other"] += pct
    return shares


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seconds", type=int, default=3, help="time per kernel measurement")
    ap.add_argument("--no-profile", action="store_true", help="skip the perf profile")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    out = subprocess.run([f"{build}/bench/kernel_bench", "--seconds", str(a.seconds)],
                         check=True, capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.strip()]
    by = {r["kernel"]: r for r in rows}
    lim = by["limits"]
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M')} UTC on {machine.describe()} (shared), "
             "1 thread, f32, D=256 (Di=512), N=16, 256 rows per call.", ""]
    lines.append(f"Limits measured in the same run: vector FMA peak "
                 f"{lim['fma_peak_gflop_per_s']:.1f} GFLOP/s (16 independent chains of 8-lane "
                 f"FMAs), sgemm {lim['sgemm_gflop_per_s']:.1f} GFLOP/s (256 x 1024 x 256).")
    lines.append("")
    lines.append("| kernel | per-channel (before) ns/token | channel-blocked ns/token | speed-up | "
                 "blocked GFLOP/s | of the FMA peak |")
    lines.append("|---|---|---|---|---|---|")
    for k in ("scan_forward", "scan_adjoint_summary", "scan_backward"):
        r = by[k]
        lines.append(f"| {k} | {r['per_channel_ns_per_token']:.0f} | "
                     f"{r['blocked_ns_per_token']:.0f} | {r['speedup']:.2f}x | "
                     f"{r['blocked_gflop_per_s']:.1f} | {r['fraction_of_fma_peak']:.0%} |")
    lines.append("")
    gemms = [r for r in rows if r["kernel"].startswith("gemm_")]
    lines.append(f"The block's products with a fixed weight through GemmPacked, and its weight "
                 f"gradients dW += dY^T X (`dw_`) through GemmAtB ({gemms[0]['packed_kernel']} "
                 "kernel), against OpenBLAS on the same operands, timed alternately, warm "
                 "caches; and ours again with C and the weight (for dW, X) cold and A warm, as "
                 "inside a gradient (a 64 MiB sweep before each call, bench/kernel_bench.cc "
                 "TimeColdCall):")
    lines.append("")
    lines.append("| product | M x N x K | OpenBLAS GFLOP/s | ours GFLOP/s | speed-up | "
                 "of the FMA peak | ours, cold GFLOP/s |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in gemms:
        lines.append(f"| {r['kernel'][5:]} | {r['M']} x {r['N']} x {r['K']} | "
                     f"{r['openblas_gflop_per_s']:.1f} | {r['packed_gflop_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['fraction_of_fma_peak']:.0%} | "
                     f"{r['packed_cold_gflop_per_s']:.1f} |")
    lines.append("")
    lines.append("| kernel | ns/token | GEMM GFLOP/s | of the sgemm rate |")
    lines.append("|---|---|---|---|")
    for k in ("block_forward", "block_backward"):
        r = by[k]
        lines.append(f"| {k} | {r['ns_per_token']:.0f} | {r['gemm_gflop_per_s']:.1f} | "
                     f"{r['fraction_of_sgemm']:.0%} |")
    lines.append("")
    lines.append("Scan flops are those the blocked kernel executes per (token, channel, state), "
                 "an FMA as 2 (forward 21, adjoint summary 19, backward 35: bench/kernel_bench.cc "
                 "lists them); the FMA peak is a yardstick, not a bound (adds, clamps and "
                 "shuffles run on other pipes). The block's figure counts its GEMM flops only "
                 "(bench/flops.h) over its whole time, scan and element-wise work included.")
    if not a.no_profile and shutil.which("perf"):
        with tempfile.TemporaryDirectory() as work:
            prof = {s: profile(build, s, work) for s in ("spans", "wavefront")}
        lines.append("")
        lines.append("### Where one gradient's time goes")
        lines.append("")
        lines.append("`perf record -F 2000` of `bench/grad_bench --tokens 16384 --threads 1 "
                     "--schedule S` (D=256, K=4, N=16, chunk 256), samples grouped by symbol; "
                     "each share the median of 3 profiles:")
        lines.append("")
        lines.append("| where | spans (default) | wavefront |")
        lines.append("|---|---|---|")
        for name in [g for g, _ in GROUPS] + ["other"]:
            lines.append(f"| {name} | {prof['spans'][name]:.1f}% | "
                         f"{prof['wavefront'][name]:.1f}% |")
    section = "\n".join(lines)
    print(section)
    path = os.path.join(ROOT, "docs", "BENCHMARKS.md")
    text = open(path).read()
    block = ("<!-- kernels:begin -->\n## Kernels: the CPU scans and block\n\n"
             "Command: `/usr/bin/python3 bench/kernel_benchmarks.py`\n\n"
             f"{section}\n<!-- kernels:end -->")
    if "<!-- kernels:begin -->" in text:
        text = re.sub(r"<!-- kernels:begin -->.*<!-- kernels:end -->", lambda _: block, text,
                      flags=re.S)
    else:
        text = text.replace("<!-- core:begin -->", block + "\n\n<!-- core:begin -->", 1)
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
