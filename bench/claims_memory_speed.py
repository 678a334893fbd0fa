#!/usr/bin/python3
"""Peak memory and tokens/s of one training gradient against the context length T, for adjsh
(in-process; and a coordinator with 2 worker processes), the in-repo keep-everything oracle,
PyTorch autograd, and PyTorch with every layer under torch.utils.checkpoint.

  /usr/bin/python3 bench/claims_memory_speed.py measure [--max-gib 12]   # appends to the JSON
  /usr/bin/python3 bench/claims_memory_speed.py report                  # figure + BENCHMARKS.md

Model D=256, K=4, N=16, W=4, E=2, V=256, f32, 2 threads. One process per measurement; peak
memory is each process's peak RSS (VmHWM), so it counts the binary, the model and the runtime
too. A point is measured only if the linear fit of the points below it predicts that it fits
in --max-gib (the machine is shared); the longest T in 16 GiB is the linear fit's, extrapolated
where it was not measured. Results: docs/claims/memory_speed.json; figure:
docs/claims/memory_speed.png.
"""
import glob
import json
import os
import re
import sys
import tempfile

from claims_common import (DATA, ROOT, TORCH_PY, Results, linear_fit, measure_report_cli,
                           measured_span, replace_section, run_tracked, save_figure)

JSON = os.path.join(DATA, "memory_speed.json")
PNG = os.path.join(DATA, "memory_speed.png")
K = 1024
IMPLS = {  # name: (label, T points)
    # 24K and 32K: the peers of the PyTorch points just under 16 GiB, measured at the same time
    "adjsh": ("adjsh, in-process", [K, 4 * K, 16 * K, 24 * K, 32 * K, 64 * K, 256 * K, 1024 * K]),
    "adjsh-2w-coordinator": ("adjsh, coordinator (2 workers)", [K, 4 * K, 16 * K, 64 * K, 256 * K, 1024 * K]),
    "adjsh-2w-worker": ("adjsh, one worker (2 workers)", []),  # measured with the coordinator
    "oracle": ("in-repo oracle (keeps everything)", [K, 4 * K, 16 * K]),
    # the last points: the ones just under the 16 GiB limit the smaller points predict
    "torch": ("PyTorch autograd", [K, 4 * K, 16 * K, 24 * K, 32 * K]),
    "torch-ckpt": ("PyTorch, checkpoint per layer", [K, 4 * K, 16 * K, 32 * K, 64 * K]),
}
LINE = re.compile(r"loss ([\d.]+)\s+tokens (\d+)\s+([\d.]+) s\s+(\d+) tokens/s\s+peak RSS ([\d.]+) MiB")


def measure_one(impl, T, build, work):
    if impl.startswith("adjsh"):
        tok = os.path.join(work, f"t{T}.u32")
        if not os.path.exists(tok):
            run_tracked([f"{build}/cli/adjsh", "tokenize", "--text",
                         "/usr/share/common-licenses/GPL-3", "--out", tok, "--length", str(T)])
        cmd = ["nice", f"{build}/cli/adjsh", "grad", "--model", os.path.join(work, "model"),
               "--tokens", tok, "--out", os.path.join(work, "g.safetensors"), "--threads", "2"]
        if impl != "adjsh":
            cmd += ["--workers", "2"]
        _, err, _, peaks = run_tracked(cmd)
        m = LINE.search(err)
        row = {"seconds": float(m.group(3)), "tokens_per_s": T / float(m.group(3)),
               "loss": float(m.group(1))}
        if impl == "adjsh":
            return [dict(row, impl="adjsh", peak_bytes=peaks["main"])]
        workers = [v for k, v in peaks.items() if k.startswith("worker:")]
        return [dict(row, impl="adjsh-2w-coordinator", peak_bytes=int(float(m.group(5)) * 2**20)),
                dict(row, impl="adjsh-2w-worker", peak_bytes=max(workers),
                     worker_peaks=workers)]
    if impl == "oracle":
        cmd = ["nice", f"{build}/bench/grad_bench", "--impl", "oracle", "--tokens", str(T),
               "--threads", "2"]
    else:
        cmd = ["nice", TORCH_PY, os.path.join(ROOT, "bench", "torch_baseline.py"),
               "--hidden-size", "256", "--layers", "4", "--state-size", "16", "--vocab-size",
               "256", "--tokens", str(T), "--threads", "2"]
        if impl == "torch-ckpt":
            cmd.append("--checkpoint-layers")
    out, _, _, peaks = run_tracked(cmd)
    r = json.loads(out.strip().splitlines()[-1])
    return [{"impl": impl, "seconds": r["seconds"], "tokens_per_s": r["tokens_per_s"],
             "loss": r["loss"], "peak_bytes": peaks["main"]}]


def measure(a):
    res = Results(a.json)
    build = os.path.abspath(a.build)
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        if not a.impls or "adjsh" in a.impls:
            run_tracked([f"{build}/cli/adjsh", "init", "--out", os.path.join(work, "model"),
                         "--hidden-size", "256", "--layers", "4", "--vocab-size", "256",
                         "--state-size", "16", "--seed", "1"])
        plan = sorted({(T, impl) for impl, (_, ts) in IMPLS.items() for T in ts
                       if not a.impls or impl in a.impls.split(",")})
        for T, impl in plan:
            if res.has(impl=impl, tokens=T):
                continue
            done = [(r["tokens"], r["peak_bytes"]) for r in res.rows
                    if r["impl"] == impl and "peak_bytes" in r]
            secs = [(r["tokens"], r["seconds"]) for r in res.rows
                    if r["impl"] == impl and "seconds" in r]
            if len(done) >= 2:
                i, s = linear_fit(done[-2:])
                ti, ts = linear_fit(secs[-2:])
                why = (f"predicted {(i + s * T) / 2**30:.1f} GiB" if i + s * T > a.max_gib * 2**30
                       else f"predicted {ti + ts * T:.0f} s" if ti + ts * T > a.max_seconds
                       else None)
                if why:
                    res.add({"impl": impl, "tokens": T, "skipped": why})
                    print(f"{impl} T={T}: skipped, {why}", file=sys.stderr)
                    continue
            try:
                rows = measure_one(impl, T, build, work)
            except RuntimeError as e:
                res.add({"impl": impl, "tokens": T, "failed": str(e)[-500:]})
                continue
            for r in rows:
                r["tokens"] = T
                res.add(r)
                print(f"{r['impl']} T={T}: {r['peak_bytes'] / 2**20:.0f} MiB, "
                      f"{r['tokens_per_s']:.0f} tok/s", file=sys.stderr)


def fits(rows, gib=16):
    """(measured points, intercept, slope, longest T in gib GiB) of one implementation."""
    pts = sorted((r["tokens"], r["peak_bytes"]) for r in rows if "peak_bytes" in r)
    fit = pts[-3:] if len(pts) >= 3 else pts
    i, s = linear_fit(fit)
    return pts, i, s, (gib * 2**30 - i) / s if s > 0 else float("inf")


def compare(rows):
    """Sentences: longest T in 16 GiB and speed of adjsh against each peer, same T."""
    by = {}
    for r in rows:
        if "peak_bytes" in r:
            by.setdefault(r["impl"], {})[r["tokens"]] = r
    if "adjsh" not in by:
        return []
    out = []
    ours = fits(list(by["adjsh"].values()))[3]
    for impl in ("torch", "torch-ckpt", "oracle"):
        if impl not in by:
            continue
        theirs = fits(list(by[impl].values()))[3]
        common = sorted(set(by[impl]) & set(by["adjsh"]))
        speed = "; ".join(f"{by['adjsh'][t]['tokens_per_s'] / by[impl][t]['tokens_per_s']:.1f}x "
                          f"at T={t // 1024}K" for t in common)
        out.append(f"- adjsh in-process against {IMPLS[impl][0]}: {ours / theirs:,.0f}x the "
                   f"longest context in 16 GiB; tokens/s ratio {speed}.")
    return out + [""]


def report(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for path in sorted(glob.glob(JSON.replace(".json", "*.json")))
            for r in Results(path).rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    lines = ["| implementation | T measured | peak memory at the largest measured T | bytes/token (slope) | longest T in 16 GiB | tokens/s at 1K / 16K / largest T |",
             "|---|---|---|---|---|---|"]
    detail = ["| implementation | T | peak memory | seconds | tokens/s |", "|---|---|---|---|---|"]
    for impl, (label, _) in IMPLS.items():
        rs = [r for r in rows if r["impl"] == impl and "peak_bytes" in r]
        if not rs:
            continue
        pts, i, s, longest = fits(rs)
        if impl == "adjsh-2w-worker":  # bounded by the chunk, not by T: no line to extrapolate
            s, longest = 0.0, float("inf")
        xs = [t for t, _ in pts]
        p = ax1.loglog(xs, [b / 2**30 for _, b in pts], "o-", label=label)
        if s > 1:
            ext = [xs[-1], min(max(longest, xs[-1]), 2**24)]
            ax1.loglog(ext, [(i + s * t) / 2**30 for t in ext], "--", color=p[0].get_color())
        speed = sorted((r["tokens"], r["tokens_per_s"]) for r in rs)
        if impl != "adjsh-2w-worker":  # the same runs as the coordinator's
            ax2.loglog([t for t, _ in speed], [v for _, v in speed], "o-", label=label,
                       color=p[0].get_color())
        by_t = dict(speed)
        longest_s = "no limit below 16M" if longest > 2**24 else f"{longest / 1024:,.0f}K"
        if impl == "adjsh-2w-worker":
            longest_s = "none: bounded by the chunk (flat in T)"
        elif longest > xs[-1]:
            longest_s += " (extrapolated)"
        lines.append(f"| {label} | {', '.join(f'{t // 1024}K' for t in xs)} | "
                     f"{pts[-1][1] / 2**20:,.0f} MiB | {s:,.0f} | {longest_s} | " +
                     " / ".join(f"{by_t[t]:,.0f}" if t in by_t else "-" for t in (1024, 16384))
                     + f" / {speed[-1][1]:,.0f} |")
        for r in sorted(rs, key=lambda r: r["tokens"]):
            detail.append(f"| {label} | {r['tokens']:,} | {r['peak_bytes'] / 2**20:,.0f} MiB | "
                          f"{r['seconds']:.1f} | {r['tokens_per_s']:,.0f} |")
    summary = compare(rows)
    skipped = [f"{r['impl']} at T={r['tokens']:,} ({r.get('skipped') or 'failed'})"
               for r in rows if "peak_bytes" not in r]
    ax1.axhline(16, color="grey", lw=0.8)
    ax1.text(1100, 17, "16 GiB", color="grey")
    ax1.set_xlabel("context T (tokens)"), ax1.set_ylabel("peak RSS (GiB)")
    ax1.set_title("Peak memory of one gradient (solid: measured, dashed: linear fit)")
    ax2.set_xlabel("context T (tokens)"), ax2.set_ylabel("tokens/s")
    ax2.set_title("Tokens/s of one gradient (2 cores)")
    fig.suptitle("Mamba D=256, K=4, N=16, V=256, f32, CPU (2 cores)")
    save_figure(fig, (ax1, ax2), PNG, grid="both")
    body = [f"{measured_span(rows)} on this machine (2 cores, shared with other "
            "jobs: memory is robust, speed is noisy). Model D=256, K=4, N=16, W=4, E=2, V=256, "
            "f32, 2 threads, one process per point, peak RSS per process (VmHWM; the "
            "workers' sampled every 0.2 s). adjsh points are `adjsh grad` (loss + gradient, "
            "chunk 256, tokens/s from its own timing, which includes writing the gradient); the "
            "oracle is `bench/grad_bench --impl oracle`; PyTorch is `bench/torch_baseline.py` "
            "(tests/torch/mamba_ref.py, `--checkpoint-layers` for the checkpointed variant). "
            "Points were measured only while the linear fit of the points below predicted that "
            "they fit in 12 GiB (the machine is shared; 16 GiB for the PyTorch points at 24K and "
            "32K, `--max-gib 16`) and in the time available (`--max-gib`, `--max-seconds`; the "
            "points left out are listed below); the 16 GiB limits beyond the largest measured T "
            "are the linear fit through the last (up to 3) measured points, extrapolated. The "
            "PyTorch points at 24K and 32K and adjsh's at 24K and 32K were measured later than "
            "the others, on a quieter machine: compare their speeds with each other only.", "",
            "![peak memory and tokens/s against T](claims/memory_speed.png)", "", *lines, "",
            *summary]
    if skipped:
        body += ["Not measured (memory guard or failure): " + "; ".join(skipped) + ".", ""]
    body += ["<details><summary>every point</summary>", "", *detail, "", "</details>"]
    replace_section("memory-speed", "Claims 1-2: peak memory and tokens/s against T",
                    "/usr/bin/python3 bench/claims_memory_speed.py measure && "
                    "/usr/bin/python3 bench/claims_memory_speed.py report", "\n".join(body))
    print("\n".join(lines))


def extra_flags(ap):
    ap.add_argument("--json", default=JSON, help="results file to append to (report reads "
                    "every docs/claims/memory_speed*.json)")
    ap.add_argument("--impls", default="", help="comma-separated subset of: " + ", ".join(IMPLS))
    ap.add_argument("--max-gib", type=float, default=12.0,
                    help="measure a point only if it is predicted to fit in this many GiB")
    ap.add_argument("--max-seconds", type=float, default=1200,
                    help="... and to take at most this many seconds")

if __name__ == "__main__":
    measure_report_cli(__doc__, measure, report, extra_flags)
