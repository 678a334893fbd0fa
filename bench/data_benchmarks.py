#!/usr/bin/env python3
"""Resident memory of evaluation and training against the data's size (docs/BENCHMARKS.md,
"Data and evaluation").

Usage:
  data_benchmarks.py [--adjsh build/cli/adjsh] [--work DIR] [--json FILE]

1. `adjsh eval` of a D=128, K=4, V=256 model (chunk 1024) on token files of 64K, 256K and 1M
   tokens: peak RSS, seconds, tokens/s (forward only: nothing per token is kept).
2. `adjsh train` (the same model, context 4096, 3 steps, in-process) on .u16 token files of
   16 MiB, 256 MiB and 2 GiB: peak RSS (the file is mapped and read a step at a time; the
   vocabulary check reads it all once, dropping each block's pages).
Every token file is written here, in --work (default: a temporary directory), and removed.
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

MIB = 1 << 20


def run(cmd):
    """(seconds, stderr, stdout) of a command that must succeed."""
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return time.time() - t0, p.stderr, p.stdout


def peak_rss_mib(cmd):
    """Runs cmd under /usr/bin/time -v; (peak RSS MiB, seconds, stdout, stderr)."""
    seconds, err, out = run(["/usr/bin/time", "-v"] + cmd)
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    return int(m.group(1)) / 1024.0, seconds, out, err


def write_u16(path, n_tokens):
    """n_tokens ids below 256 (a repeating byte pattern), written in 16 MiB blocks."""
    block = bytes((i * 7 + i // 251) % 256 for i in range(8 * MIB)) 
    ids = bytearray()
    for b in block:
        ids += bytes((b, 0))
    with open(path, "wb") as f:
        left = n_tokens
        while left > 0:
            n = min(left, len(ids) // 2)
            f.write(ids[:2 * n])
            left -= n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", default="build/cli/adjsh")
    ap.add_argument("--work", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if not shutil.which("/usr/bin/time"):
        sys.exit("needs /usr/bin/time (Debian package 'time')")
    work = a.work or tempfile.mkdtemp(prefix="adjsh-data-bench-")
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "model")
    run([a.adjsh, "init", "--hidden-size", "128", "--layers", "4", "--vocab-size", "256",
         "--out", model])
    results = {"eval": [], "train": []}
    try:
        for n in (65536, 262144, 1048576):
            path = os.path.join(work, f"eval{n}.u16")
            write_u16(path, n)
            rss, seconds, out, _ = peak_rss_mib([a.adjsh, "eval", "--model", model, "--tokens",
                                                 path, "--chunk", "1024", "--quiet"])
            row = {"tokens": n, "peak_rss_mib": round(rss, 1), "seconds": round(seconds, 2),
                   "tokens_per_s": round(n / seconds), "result": out.strip()}
            results["eval"].append(row)
            print("eval", row, flush=True)
            os.remove(path)
        for mib in (16, 256, 2048):
            path = os.path.join(work, f"train{mib}.u16")
            write_u16(path, mib * MIB // 2)
            ckpt = os.path.join(work, f"ckpt{mib}")
            rss, seconds, _, err = peak_rss_mib([
                a.adjsh, "train", "--model", model, "--tokens", path, "--context", "4096",
                "--chunk", "1024", "--steps", "3", "--checkpoint-every", "0",
                "--checkpoint-dir", ckpt])
            row = {"file_mib": mib, "tokens": mib * MIB // 2, "peak_rss_mib": round(rss, 1),
                   "seconds": round(seconds, 2)}
            results["train"].append(row)
            print("train", row, flush=True)
            os.remove(path)
            shutil.rmtree(ckpt, ignore_errors=True)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
