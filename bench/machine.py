"""One line naming the machine a benchmark ran on, for the tables' headers: results taken on
different machines sit side by side in docs/BENCHMARKS.md, and the CPU's vector width decides
which scan build runs (8 lanes with AVX2, two blocks of 8 per vector with AVX-512)."""
import os


def describe(cpuinfo="/proc/cpuinfo"):
    """'<CPU model>, <n> cores, <widest vector ISA>' from /proc/cpuinfo, e.g.
    'AMD EPYC, 2 cores, AVX2 (no AVX-512)'."""
    model, flags = "unknown CPU", set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    if "avx512f" in flags:
        isa = "AVX-512"
    elif "avx2" in flags and "fma" in flags:
        isa = "AVX2 (no AVX-512)"
    else:
        isa = "no AVX2 (the portable build)"
    return f"{model}, {os.cpu_count()} cores, {isa}"


if __name__ == "__main__":
    print(describe())
