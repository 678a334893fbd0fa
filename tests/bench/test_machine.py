#!/usr/bin/python3
"""bench/machine.py names the CPU model and its widest vector ISA from /proc/cpuinfo's text (the
benchmarks' headers say which scan build ran), and copes with a file it cannot read."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import machine  # noqa: E402


def describe(text):
    with tempfile.NamedTemporaryFile("w", suffix=".cpuinfo") as f:
        f.write(text)
        f.flush()
        return machine.describe(f.name)


def main():
    cores = os.cpu_count()
    two = ("processor\t: 0\nmodel name\t: CPU A\nflags\t\t: fpu {f}\n\n"
           "processor\t: 1\nmodel name\t: CPU B\nflags\t\t: fpu\n")
    assert describe(two.format(f="avx2 fma avx512f")) == f"CPU A, {cores} cores, AVX-512"
    assert describe(two.format(f="avx2 fma")) == f"CPU A, {cores} cores, AVX2 (no AVX-512)"
    # AVX2 without FMA does not get the AVX2 build (kernels/cpu/simd.h needs both).
    assert describe(two.format(f="avx2")).endswith("no AVX2 (the portable build)")
    assert describe("").startswith("unknown CPU")
    assert machine.describe("/nonexistent/cpuinfo").startswith("unknown CPU")
    print("machine:", machine.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
