#!/usr/bin/python3
"""Local-cluster scaling: step time of `adjsh train` with 1, 2 and 4 worker processes against
in-process training, and the bytes sent per token per step.

  /usr/bin/python3 bench/cluster_benchmarks.py [--build build]

Model D=128, K=4, N=16, V=256, context 16,384 tokens, 6 steps (the first is not timed), the
built-in corpus (--context and --steps change these). Writes the table into docs/BENCHMARKS.md between the `cluster` markers, the
figure to docs/claims/cluster_scaling.png and the numbers to docs/claims/cluster_scaling.json.
"""
import argparse
import json
import os
import re
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = (1, 2, 4)
STEP = re.compile(r"^step (\d+)/\d+ .*\| ([\d.]+)K tok/s")
WIRE = re.compile(r"per token per step (\d+) B out, (\d+) B back")


def train(build, workers, chunk, work, context, steps):
    """Step time: the mean time between the progress lines of steps 1..steps (the first step,
    with the start-up, is not timed), read as they are printed."""
    ck = tempfile.mkdtemp(dir=work)
    cmd = ["nice", f"{build}/cli/adjsh", "train", "--steps", str(steps), "--chunk", str(chunk),
           "--context", str(context), "--workers", str(workers), "--checkpoint-dir", ck,
           "--checkpoint-every", "0"]
    start = time.time()
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    stamps, err = {}, []
    for line in p.stderr:
        err.append(line)
        if m := STEP.match(line):
            stamps[int(m.group(1))] = time.time()
    _, status, ru = os.wait4(p.pid, 0)  # CPU time of adjsh and its reaped workers
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"failed: {' '.join(cmd)}\n{''.join(err[-20:])}")
    total = time.time() - start
    step_s = (stamps[steps] - stamps[1]) / (steps - 1)
    wire = WIRE.search("".join(err))
    return {"step_s": step_s, "total_s": total, "context": context,
            "cpu_s_per_step": (ru.ru_utime + ru.ru_stime) / steps,
            "out": int(wire.group(1)) if wire else 0, "back": int(wire.group(2)) if wire else 0}


def plot(rows, context):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    data = os.path.join(ROOT, "docs", "claims")
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(data, "cluster_scaling.json"), "w") as f:
        json.dump([{"chunk": c, "workers": w, **r} for c, w, r, _ in rows], f, indent=1)
    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(16, 4.5))
    for chunk in sorted({c for c, *_ in rows}):
        rs = [(w, r) for c, w, r, _ in rows if c == chunk]
        base = [r["step_s"] for w, r in rs if w == 0][0]
        ws = [w for w, _ in rs if w]
        ax1.plot(ws, [r["step_s"] for w, r in rs if w], "o-", label=f"chunk {chunk}")
        ax1.axhline(base, ls="--", lw=0.8, color=ax1.lines[-1].get_color())
        ax2.plot(ws, [r["out"] + r["back"] for w, r in rs if w], "o-", label=f"chunk {chunk}")
        ax3.plot(ws, [r["cpu_s_per_step"] for w, r in rs if w], "o-", label=f"chunk {chunk}")
        ax3.axhline([r["cpu_s_per_step"] for w, r in rs if w == 0][0], ls="--", lw=0.8,
                    color=ax3.lines[-1].get_color())
    ax1.set_xlabel("worker processes (dashed: in-process)"), ax1.set_ylabel("step time (s)")
    ax1.set_title(f"Step time, D=128 K=4, context {context:,}, 2 cores")
    ax2.set_xlabel("worker processes"), ax2.set_ylabel("bytes per token per step (out + back)")
    ax2.set_title("Wire traffic per token")
    ax3.set_xlabel("worker processes (dashed: in-process)")
    ax3.set_ylabel("CPU s per step, all processes"), ax3.set_title("CPU time per step")
    for ax in (ax1, ax2, ax3):
        ax.set_xticks(list(WORKERS))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_title(ax1.get_title() + " (shared)")
    fig.tight_layout()
    fig.savefig(os.path.join(data, "cluster_scaling.png"), dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--context", type=int, default=16384, help="tokens per step")
    ap.add_argument("--steps", type=int, default=6, help="steps per run (the first is not timed)")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw the figure from docs/claims/cluster_scaling.json")
    a = ap.parse_args()
    if a.replot:
        saved = json.load(open(os.path.join(ROOT, "docs", "claims", "cluster_scaling.json")))
        plot([(r["chunk"], r["workers"], r, 0) for r in saved], saved[0]["context"])
        return
    build = os.path.abspath(a.build)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for chunk in (256, 1024):
            base = train(build, 0, chunk, work, a.context, a.steps)
            rows.append((chunk, 0, base, 1.0))
            for w in WORKERS:
                r = train(build, w, chunk, work, a.context, a.steps)
                rows.append((chunk, w, r, r["step_s"] / base["step_s"]))
    plot(rows, a.context)
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on this machine (2 cores, shared with other "
             f"jobs): `adjsh train` D=128, K=4, N=16, V=256, context {a.context:,}, steps "
             f"2-{a.steps} timed (the time between their progress lines). The workers are "
             "processes on the same 2 cores as the coordinator. CPU time is that of the "
             "coordinator and its workers together over the whole run (start-up included), per "
             "step: the cost of the protocol, which the step time on a shared machine does not "
             "show (each extra process also wins a share of the cores from the other jobs).", "",
             "![step time against workers](claims/cluster_scaling.png)", "",
             "| chunk | workers | step time | vs in-process | CPU s per step | vs in-process | "
             "bytes/token/step to workers | bytes/token/step back |",
             "|---|---|---|---|---|---|---|---|"]
    cpu0 = {}
    for chunk, w, r, ratio in rows:
        cpu0.setdefault(chunk, r["cpu_s_per_step"])
        lines.append(f"| {chunk} | {w or 'in-process'} | {r['step_s']:.2f} s | {ratio:.2f}x | "
                     f"{r['cpu_s_per_step']:.2f} | {r['cpu_s_per_step'] / cpu0[chunk]:.2f}x | "
                     f"{r['out'] if w else '-'} | {r['back'] if w else '-'} |")
    lines += ["", "Back: each task returns its layer's whole partial gradient (3 Di D + ... "
              "numbers) plus dL/du for its rows, so larger chunks send less per token; out: the "
              "layer-input and dL/du rows of the chunk, its state and incoming adjoint, and each "
              "layer's parameters once per step per worker.", "",
              "What it means for a fleet: here the coordinator and every worker share two "
              "cores, so the falling step time is the larger share of a contended machine, not "
              "parallel speed; the CPU column is the protocol's real cost (serialising, "
              "copying and sending the task inputs and results). With a core or GPU per worker, "
              "the backward tasks would run in parallel, but the remote backward is the "
              "wavefront: task (k, c) waits for (k + 1, c) and (k, c + 1), so at most "
              "min(K, chunks) tasks are ready at once: a fleet's speed-up on the backward is "
              "bounded by K (4 here), and the forward pass and head run on the coordinator "
              "alone. The wire cost per token per step barely depends on the number of workers "
              "(the parameters go once per worker per step), so at the measured bytes/token a "
              "1M-token step moves about "
              f"{(rows[-1][2]['out'] + rows[-1][2]['back']) / 1024:.1f} GiB (chunk {rows[-1][0]}) "
              "between the coordinator and the workers: about "
              f"{(rows[-1][2]['out'] + rows[-1][2]['back']) * 2**20 * 8 / 1e10:.1f} s on a 10 Gbit/s "
              "link."]
    section = "\n".join(lines)
    args = "" if (a.context, a.steps) == (16384, 6) else f" --context {a.context} --steps {a.steps}"
    print(section)
    path = os.path.join(ROOT, "docs", "BENCHMARKS.md")
    text = open(path).read()
    block = ("<!-- cluster:begin -->\n## Distributed: local cluster scaling\n\n"
             f"Command: `/usr/bin/python3 bench/cluster_benchmarks.py{args}`\n\n" + section +
             "\n<!-- cluster:end -->")
    if "<!-- cluster:begin -->" in text:
        text = re.sub(r"<!-- cluster:begin -->.*<!-- cluster:end -->", lambda _: block, text, flags=re.S)
    else:
        text = text.replace("## Notes on the measurements", block + "\n\n## Notes on the measurements")
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
