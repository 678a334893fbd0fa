#!/usr/bin/python3
"""Storage benchmark: layer inputs and chunk states kept in f32 (full) or bf16, one run.

  /usr/bin/python3 bench/storage_benchmarks.py [--build build] [--quick]

On a synthetic Mamba model (D=256, K=4, N=16, V=256, f32 compute, 2 threads):
  * memory: peak RSS of `adjsh grad --storage full|bf16` at T = 16K, 64K, 256K; bytes per token
    as the least-squares slope of peak RSS in T;
  * speed: tokens/s of both at the smallest T (the cost of rounding and widening);
  * accuracy: per-tensor relative L2 error of each against the f64 gradient (`--dtype f64`) at
    T = 16K.
Writes the table into docs/BENCHMARKS.md between the `storage` markers, and prints it.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from claims_common import ROOT, linear_fit, read_safetensors, replace_section


def run(cmd):
    """Runs cmd, returns (peak RSS of the child in bytes, seconds)."""
    start = time.time()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{err.read().decode()}")
    return ru.ru_maxrss * 1024, time.time() - start


def worst_rel_err(a, b):
    errs = {k: np.linalg.norm(a[k] - b[k]) / max(np.linalg.norm(b[k]), 1e-300)
            for k in b if k != "loss"}
    name = max(errs, key=errs.get)
    return errs[name], name


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true", help="small T only (a smoke run)")
    a = ap.parse_args()
    adjsh = os.path.join(os.path.abspath(a.build), "cli", "adjsh")
    mem_T = [2048, 4096, 8192] if a.quick else [16384, 65536, 262144]
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, "model")
        run([adjsh, "init", "--out", model, "--hidden-size", "256", "--layers", "4",
             "--vocab-size", "256", "--seed", "1"])
        rows = {}
        for T in mem_T:
            tok = os.path.join(work, f"t{T}.u32")
            run([adjsh, "tokenize", "--text", "/usr/share/common-licenses/GPL-3", "--out", tok,
                 "--length", str(T)])
            for storage in ("full", "bf16"):
                out = os.path.join(work, f"g_{storage}_{T}.safetensors")
                rss, sec = run([adjsh, "grad", "--model", model, "--tokens", tok, "--out", out,
                                "--threads", "2", "--storage", storage, "--quiet"])
                rows[(storage, T)] = (rss, sec)
                print(f"{storage} T={T}: {rss / 2**20:.0f} MiB, {T / sec:.0f} tok/s",
                      file=sys.stderr)
            if T == mem_T[0]:
                ref = os.path.join(work, "g_f64.safetensors")
                run([adjsh, "grad", "--model", model, "--tokens", tok, "--out", ref,
                     "--threads", "2", "--dtype", "f64", "--quiet"])
                exact = read_safetensors(ref)
                acc = {s: worst_rel_err(read_safetensors(
                    os.path.join(work, f"g_{s}_{T}.safetensors")), exact)
                    for s in ("full", "bf16")}
    T0 = mem_T[0]
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on this machine (2 cores), `adjsh grad`, "
             "D=256, K=4, N=16, V=256, f32 compute, 2 threads, chunk 256, one process per "
             "measurement.", "",
             "| storage | T | peak RSS | bytes/token (slope in T) |", "|---|---|---|---|"]
    slopes = {s: linear_fit([(T, rows[(s, T)][0]) for T in mem_T])[1] for s in ("full", "bf16")}
    for s in ("full", "bf16"):
        for T in mem_T:
            lines.append(f"| {s} | {T} | {rows[(s, T)][0] / 2**20:.0f} MiB | "
                         f"{slopes[s]:.0f} ({slopes[s] / 1024:.2f} KiB) |")
    speed = {s: T0 / rows[(s, T0)][1] for s in ("full", "bf16")}
    lines += ["",
              f"bf16 / full bytes per token: {slopes['bf16'] / slopes['full']:.2f} "
              f"(stored: K rows of D values and K Di N / C state values per token in bf16, "
              f"one row of D in f32 for dL/du).",
              f"Tokens/s at T={T0} (whole command, same run): full {speed['full']:.0f}, bf16 "
              f"{speed['bf16']:.0f} (ratio {speed['bf16'] / speed['full']:.2f}).",
              f"Worst per-tensor relative L2 error against the f64 gradient at T={T0}: full "
              f"{acc['full'][0]:.1e} ({acc['full'][1]}), bf16 {acc['bf16'][0]:.1e} "
              f"({acc['bf16'][1]})."]
    section = "\n".join(lines)
    print(section)
    if a.quick:
        return
    replace_section("storage", "Storage: layer inputs in f32 or bf16",
                    "/usr/bin/python3 bench/storage_benchmarks.py", section)

if __name__ == "__main__":
    main()
