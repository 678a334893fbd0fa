#!/usr/bin/python3
"""Core benchmarks: one gradient on the CPU, adjsh against its peers, measured in one run.

  /usr/bin/python3 bench/core_benchmarks.py [--build build] [--quick]

Runs, on a synthetic Mamba model (D=256, K=4, N=16, V=256, f32, 2 threads everywhere):
  * speed: tokens/s of one gradient at T = 4K and 16K, adjsh (the default span schedule, the same
    with no activations kept between a summary and the task after it, and the in-process
    wavefront) vs PyTorch autograd
    (bench/torch_baseline.py), and adjsh's flop rate vs this machine's sgemm rate (bench/sgemm_rate);
  * memory: peak RSS of `adjsh grad` at T = 16K, 64K, 256K (and at D=128; with the default
    --kept-mib and with none kept), of the in-repo
    keep-everything oracle, and of PyTorch autograd; bytes per token as the slope of peak RSS in T.
Writes the tables into docs/BENCHMARKS.md between the `core` markers, and prints them.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import machine  # bench/machine.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_PY = "/usr/bin/python3"


def run(cmd, **kw):
    """Runs cmd, returns (stdout, peak RSS of the child in bytes, seconds)."""
    start = time.time()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, **kw)
        _, status, ru = os.wait4(p.pid, 0)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{stderr}")
    return stdout, ru.ru_maxrss * 1024, time.time() - start


def adjsh_grad(build, work, model, T, threads=2, schedule="spans", kept_mib=None, timed=True):
    """kept_mib: --kept-mib (None: the default); timed: also time it with grad_bench."""
    kept = [] if kept_mib is None else ["--kept-mib", str(kept_mib)]
    tok = os.path.join(work, f"t{T}.u32")
    if not os.path.exists(tok):
        run([f"{build}/cli/adjsh", "tokenize", "--text", "/usr/share/common-licenses/GPL-3",
             "--out", tok, "--length", str(T)])
    _, rss, _ = run([f"{build}/cli/adjsh", "grad", "--model", model, "--tokens", tok,
                     "--out", os.path.join(work, "g.safetensors"), "--threads", str(threads),
                     "--quiet"] + kept)
    if not timed:
        return {"cli_peak_rss_bytes": rss}
    # Time in-process (no file I/O) with the same engine, for tokens/s and flop rates: the
    # fastest of 3 gradients, since other jobs share this machine.
    # The yardstick measured just before, on as many threads: on a shared machine the sgemm rate
    # moves by several percent between the start of a run and a gradient minutes later.
    rate, _, _ = run([f"{build}/bench/sgemm_rate", "--threads", str(threads), "--seconds", "2"])
    out, _, _ = run([f"{build}/bench/grad_bench", "--hidden-size", model_d(model),
                     "--layers", "4", "--tokens", str(T), "--threads", str(threads),
                     "--schedule", schedule, "--repeat", "3"] + kept)  # the fastest of 3
    r = json.loads(out)
    r["cli_peak_rss_bytes"] = rss
    r["sgemm_before_gflop_per_s"] = json.loads(rate)["sgemm_gflop_per_s"]
    return r


def model_d(model):
    with open(os.path.join(model, "config.json")) as f:
        return str(json.load(f)["hidden_size"])


def torch_grad(T, d=256, runs=3):
    """PyTorch autograd's gradient at T, the fastest of `runs` processes, as adjsh's is the
    fastest of 3 gradients (one timed run of the peer against adjsh's best favoured adjsh)."""
    best = None
    for _ in range(runs):
        out, _, _ = run([TORCH_PY, os.path.join(ROOT, "bench", "torch_baseline.py"),
                         "--hidden-size", str(d), "--layers", "4", "--state-size", "16",
                         "--vocab-size", "256", "--tokens", str(T), "--threads", "2"])
        r = json.loads(out.strip().splitlines()[-1])
        if best is None or r["tokens_per_s"] > best["tokens_per_s"]:
            best = r
    return best


def oracle(build, T):
    out, _, _ = run([f"{build}/bench/grad_bench", "--impl", "oracle", "--tokens", str(T),
                     "--threads", "1"])
    return json.loads(out)


def slope(points):
    """Bytes per token: least-squares slope of peak RSS against T."""
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(b for _, b in points) / n
    return sum((t - mx) * (b - my) for t, b in points) / sum((t - mx) ** 2 for t, _ in points)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true", help="small T only (a smoke run)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    speed_T = [1024, 2048] if a.quick else [4096, 16384]
    mem_T = [4096, 8192, 16384] if a.quick else [16384, 65536, 262144]
    oracle_T = [256, 512] if a.quick else [512, 1024, 2048]
    lines = []
    with tempfile.TemporaryDirectory() as work:
        models = {}
        for d in (256, 128):
            models[d] = os.path.join(work, f"model{d}")
            run([f"{build}/cli/adjsh", "init", "--out", models[d], "--hidden-size", str(d),
                 "--layers", "4", "--vocab-size", "256", "--seed", "1"])
        sgemm = {t: json.loads(run([f"{build}/bench/sgemm_rate", "--threads", str(t),
                                    "--seconds", "3"])[0])
                 for t in (1, 2)}
        speed = []
        for T in speed_T:
            ours = adjsh_grad(build, work, models[256], T)
            bare = adjsh_grad(build, work, models[256], T, kept_mib=0)
            two = adjsh_grad(build, work, models[256], T, schedule="wavefront")
            theirs = torch_grad(T)
            speed.append((T, ours, theirs, two, bare))
            print(f"speed T={T}: adjsh {ours['tokens_per_s']:.0f} tok/s, "
                  f"torch {theirs['tokens_per_s']:.0f} tok/s", file=sys.stderr)
        mem = {d: [] for d in (256, 128)}
        for d in (256, 128):
            for T in mem_T:
                r = adjsh_grad(build, work, models[d], T, timed=False)
                none = adjsh_grad(build, work, models[d], T, kept_mib=0, timed=False)
                mem[d].append((T, r["cli_peak_rss_bytes"], none["cli_peak_rss_bytes"]))
                print(f"memory D={d} T={T}: {r['cli_peak_rss_bytes'] / 2**20:.0f} MiB, "
                      f"{none['cli_peak_rss_bytes'] / 2**20:.0f} MiB with none kept",
                      file=sys.stderr)
        orc = [(T, oracle(build, T)) for T in oracle_T]

    lines.append(f"Measured {time.strftime('%Y-%m-%d')} on {machine.describe()}, f32, 2 threads "
                 "for every implementation, one process per measurement. Model: D=256, K=4, N=16, "
                 "W=4, E=2, R=16, V=256 (synthetic weights).")
    lines.append("")
    lines.append(f"sgemm through OpenBLAS at the engine's shapes (`build/bench/sgemm_rate`): "
                 f"{sgemm[1]['sgemm_gflop_per_s']:.1f} GFLOP/s on 1 thread, "
                 f"{sgemm[2]['sgemm_gflop_per_s']:.1f} GFLOP/s on 2.")
    lines.append("")
    lines.append("### Speed: one exact gradient")
    lines.append("")
    lines.append("| T | schedule | adjsh tokens/s | PyTorch autograd tokens/s | ratio to PyTorch | adjsh GFLOP/s (model / executed) | executed / sgemm rate (at the start; just before) |")
    lines.append("|---|---|---|---|---|---|---|")
    for T, o, t, wave, bare in speed:
        rows = ((f"spans (default, S = {o['spans']}; {o['kept_share']:.0%} kept)", o),
                (f"spans, none kept (`--kept-mib 0`)", bare), ("wavefront", wave))
        for name, r in rows:
            lines.append(f"| {T} | {name} | {r['tokens_per_s']:.0f} | {t['tokens_per_s']:.0f} | "
                         f"{r['tokens_per_s'] / t['tokens_per_s']:.1f}x | "
                         f"{r['model_gflop_per_s']:.1f} / {r['executed_gflop_per_s']:.1f} | "
                         f"{r['executed_gflop_per_s'] / sgemm[2]['sgemm_gflop_per_s']:.0%}; "
                         f"{r['executed_gflop_per_s'] / r['sgemm_before_gflop_per_s']:.0%} |")
    lines.append("")
    lines.append("Each tokens/s is the fastest of 3 gradients, adjsh's in one process "
                 "(`grad_bench --repeat 3`), PyTorch's in 3 processes (bench/torch_baseline.py). "
                 "The sgemm rate is OpenBLAS's on 2 threads (`build/bench/sgemm_rate`), measured "
                 "once at the start of the run and again for 2 s just before each timed gradient "
                 "(the second ratio), since the machine's load moves it between the two.")
    lines.append("")
    lines.append("\"model\" counts the GEMM flops of a keep-everything backprop; \"executed\" adds "
                 "what adjoint sharding recomputes (the recompute in each VJP task); "
                 "bench/flops.h. The span schedule's summary tasks also run S - 1 of its S spans, "
                 "forward and backward, so that the spans of a layer run at once; what they "
                 "recompute is kept for the task after them (\"kept\": the share of summarised "
                 "chunks whose activations were, under the default 256 MiB `--kept-mib`; the same "
                 "bits), which then skips it: fully kept, the spans execute the wavefront's flops. "
                 "The wavefront (in-process only, `--schedule wavefront`) runs each chunk's "
                 "forward once and carries its activations to the chunk's backward under the "
                 "same budget, with at most K tasks runnable.")
    lines.append("")
    lines.append("### Memory: peak RSS of one gradient")
    lines.append("")
    lines.append("| implementation | D | T | peak RSS | bytes/token (slope in T) |")
    lines.append("|---|---|---|---|---|")
    for d in (256, 128):
        for label, i in (("`adjsh grad`", 1), ("`adjsh grad --kept-mib 0`", 2)):
            s = slope([(m[0], m[i]) for m in mem[d]])
            for m in mem[d]:
                lines.append(f"| {label} | {d} | {m[0]} | {m[i] / 2**20:.0f} MiB | "
                             f"{s:.0f} ({s / 1024:.2f} KiB) |")
    so = slope([(T, r["peak_rss_bytes"]) for T, r in orc])
    for T, r in orc:
        lines.append(f"| in-repo oracle (keeps everything) | 256 | {T} | {r['peak_rss_bytes'] / 2**20:.0f} MiB | {so:.0f} |")
    st = slope([(sp[0], sp[2]["peak_rss_bytes"]) for sp in speed])
    for T, _, t, *_ in speed:
        lines.append(f"| PyTorch autograd | 256 | {T} | {t['peak_rss_bytes'] / 2**20:.0f} MiB | {st:.0f} |")
    lines.append("")
    lines.append('What adjsh stores per token in f32 (docs/MATH.md "Memory"): '
                 "the K layer inputs (dL/du^k "
                 "replaces dL/du^{k+1} chunk by chunk in one buffer in the backward) and u^{K+1}, "
                 "then dL/du^{K+1}: "
                 f"K + 1 rows of D floats, {(4 + 1) * 256 * 4} B at D=256 and "
                 f"{(4 + 1) * 128 * 4} B at D=128; plus the chunk-boundary states (K Di N floats "
                 f"per chunk of 256 tokens: {4 * 512 * 16 * 4 // 256} B/token at D=256, "
                 f"{4 * 256 * 16 * 4 // 256} B/token at D=128). The kept activations add at "
                 "most the 256 MiB budget (`--kept-mib`), whatever T: once they fill it the slope "
                 "is that with none kept (D=256 here, about 16 KB per token kept); at D=128, 16K "
                 "tokens keep less than the budget, which steepens the fitted slope.")
    section = "\n".join(lines)
    print(section)
    path = os.path.join(ROOT, "docs", "BENCHMARKS.md")
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    block = (f"<!-- core:begin -->\n## Core: one gradient on the CPU\n\n"
             f"Command: `/usr/bin/python3 bench/core_benchmarks.py`\n\n{section}\n<!-- core:end -->")
    if "<!-- core:begin -->" in text:
        text = re.sub(r"<!-- core:begin -->.*<!-- core:end -->", lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    if not a.quick:
        with open(path, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
