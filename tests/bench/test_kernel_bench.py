#!/usr/bin/python3
"""bench/kernel_bench runs every measurement and prints what bench/kernel_benchmarks.py reads:
one JSON line per kernel with finite, positive figures (no speed is asserted here: speed goals
live in docs/BENCHMARKS.md). bench/sgemm_rate, the yardstick bench/core_benchmarks.py divides
by, prints its one line the same way. Also: --help, and bad flags refused with a message and
exit 2.

  test_kernel_bench.py --kernel-bench PATH --sgemm-rate PATH
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
    a = ap.parse_args()
    # A small shape with channels left over after the last block of 8 and a run-time N.
    out = subprocess.run([a.kernel_bench, "--hidden-size", "20", "--state-size", "5", "--rows", "33",
                          "--seconds", "1"], check=True, capture_output=True, text=True).stdout
    rows = {r["kernel"]: r for r in map(json.loads, out.splitlines())}
    want = {"limits", "scan_forward", "scan_adjoint_summary", "scan_backward", "block_forward",
            "block_backward"}
    assert set(rows) == want, sorted(rows)
    for name, r in rows.items():
        for k, v in r.items():
            if isinstance(v, (int, float)):
                assert math.isfinite(v) and v > 0, (name, k, v)
    assert rows["scan_backward"]["Di"] == 40 and rows["scan_backward"]["N"] == 5
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
    print("kernel_bench, sgemm_rate: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
