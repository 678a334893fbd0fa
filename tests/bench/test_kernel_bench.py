#!/usr/bin/python3
"""bench/kernel_bench runs every measurement and prints what bench/kernel_benchmarks.py reads:
one JSON line per kernel with finite, positive figures (no speed is asserted here: speed goals
live in docs/BENCHMARKS.md). bench/sgemm_rate, the yardstick bench/core_benchmarks.py divides
by, prints its one line the same way. Also, for them and for bench/grad_bench (and
bench/cuda_scan_bench where CUDA is built): --help, and bad flags refused with a message and
exit 2, never an abort.

  test_kernel_bench.py --kernel-bench PATH --sgemm-rate PATH --grad-bench PATH
                       [--cuda-scan-bench PATH]
"""
import argparse
import json
import math
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel-bench", required=True)
    ap.add_argument("--sgemm-rate", required=True)
    ap.add_argument("--grad-bench", required=True)
    ap.add_argument("--cuda-scan-bench")
    a = ap.parse_args()
    # A small shape with channels left over after the last block of 8 and a run-time N.
    out = subprocess.run([a.kernel_bench, "--hidden-size", "20", "--state-size", "5", "--rows", "33",
                          "--seconds", "1"], check=True, capture_output=True, text=True).stdout
    rows = {r["kernel"]: r for r in map(json.loads, out.splitlines())}
    want = {"limits", "scan_forward", "scan_adjoint_summary", "scan_backward", "gemm_in_proj_half",
            "gemm_x_proj", "gemm_out_proj", "gemm_dn", "gemm_dw_in", "gemm_dw_out", "gemm_dw_x",
            "block_forward", "block_backward"}
    assert set(rows) == want, sorted(rows)
    for name, r in rows.items():
        for k, v in r.items():
            if isinstance(v, (int, float)):
                assert math.isfinite(v) and v > 0, (name, k, v)
    assert rows["scan_backward"]["Di"] == 40 and rows["scan_backward"]["N"] == 5
    assert (rows["gemm_x_proj"]["N"], rows["gemm_x_proj"]["K"]) == (2 + 2 * 5, 40)  # R + 2N, Di
    assert rows["gemm_dn"]["packed_kernel"] in ("avx512", "avx2", "scalar")
    assert (rows["gemm_dw_in"]["M"], rows["gemm_dw_in"]["N"]) == (2 * 40, 20)  # 2 Di, D
    for name in ("gemm_in_proj_half", "gemm_x_proj", "gemm_out_proj", "gemm_dn", "gemm_dw_in",
                 "gemm_dw_out", "gemm_dw_x"):
        assert "packed_cold_gflop_per_s" in rows[name], rows[name]
    bad = subprocess.run([a.kernel_bench, "--rows", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "rows" in bad.stderr, (bad.returncode, bad.stderr)

    out = subprocess.run([a.sgemm_rate, "--threads", "2", "--seconds", "1"], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    assert len(out) == 1, out
    r = json.loads(out[0])
    assert r["threads"] == 2 and math.isfinite(r["sgemm_gflop_per_s"]), r
    assert r["sgemm_gflop_per_s"] > 0, r
    usage = subprocess.run([a.sgemm_rate, "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "--threads" in usage.stdout + usage.stderr, usage
    for flags, word in ((["--threads", "0"], "threads"), (["--seconds", "x"], "seconds"),
                        (["3"], "")):
        bad = subprocess.run([a.sgemm_rate, *flags], capture_output=True, text=True)
        assert bad.returncode == 2 and word in bad.stderr and not bad.stdout, (flags, bad)

    # grad_bench: a small gradient's line, then every integer flag out of range and a bad dtype.
    def small_gradient(*extra):
        return json.loads(subprocess.run(
            [a.grad_bench, "--hidden-size", "16", "--layers", "2", "--tokens", "300", "--chunk",
             "64", *extra], check=True, capture_output=True, text=True).stdout)

    r = small_gradient()
    assert r["tokens"] == 300 and math.isfinite(r["loss"]) and r["seconds"] > 0, r
    # --kept-mib (cli/device_flags.h, as on grad, train and worker): by default every summarised
    # chunk keeps its set, with 0 none does, and the gradient is the same either way.
    # Forward sets carried on to the backward (kernels/cpu/mamba_block.h Carries) are counted.
    assert r["kept_share"] == 1 and 0 < r["carried_share"] <= 1, r
    none = small_gradient("--kept-mib", "0")
    assert none["kept_share"] == 0 and none["carried_share"] == 0, none
    assert none["loss"] == r["loss"], (none, r)
    for flags, word in ((["--tokens", "-1"], "--tokens"), (["--tokens", "1"], "--tokens"),
                        (["--layers", "0"], "--layers"), (["--repeat", "0"], "--repeat"),
                        (["--threads", "x"], "--threads"), (["--dtype", "f16"], "--dtype"),
                        (["--schedule", "fast"], "--schedule"), (["--device", "gpu"], "--device"),
                        (["--kept-mib", "-1"], "--kept-mib"), (["--kept-mib", "1G"], "--kept-mib")):
        bad = subprocess.run([a.grad_bench, *flags], capture_output=True, text=True)
        assert bad.returncode == 2 and word in bad.stderr and not bad.stdout, (flags, bad)

    if a.cuda_scan_bench:  # the flags are read before any device is looked for
        usage = subprocess.run([a.cuda_scan_bench, "--help"], capture_output=True, text=True)
        assert usage.returncode == 0 and "--storage" in usage.stdout, usage
        for flags, word in ((["--len", "5x"], "--len"), (["--state", "33"], "--state"),
                            (["--repeat", "0"], "--repeat"), (["--storage", "f16"], "--storage"),
                            (["--len"], "--len"), (["--bogus", "1"], "--bogus")):
            bad = subprocess.run([a.cuda_scan_bench, *flags], capture_output=True, text=True)
            assert bad.returncode == 2 and word in bad.stderr and not bad.stdout, (flags, bad)
    print("kernel_bench, sgemm_rate, grad_bench" + (", cuda_scan_bench" if a.cuda_scan_bench
                                                    else "") + ": ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
