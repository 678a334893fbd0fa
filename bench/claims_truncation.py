#!/usr/bin/python3
"""The truncated adjoint window (docs/MATH.md "Truncated adjoint") against the exact gradient:
  * gradient error (relative L2 and cosine, overall and per parameter group) of
    `adjsh grad --window Wt` for Wt in {64, 256, 1K, 4K, 16K} at T = 64K, on the freshly
    initialised model and on the same model after the exact training run below;
  * training: `adjsh train --window Wt` against exact from the same initial model, the same
    steps and data (the built-in corpus); loss per step.

  /usr/bin/python3 bench/claims_truncation.py measure   # appends to docs/claims/truncation.json
  /usr/bin/python3 bench/claims_truncation.py report    # figure + docs/BENCHMARKS.md

Model D=128, K=4, N=16, V=256 (seed 0), f32, chunk 256. Training (shortened to fit a shared
2-core machine), lr 3e-3 (the defaults of `adjsh train`): context 2,048 for 30 steps with
windows {64, 256, 1K} (a 2K window is exact at this context), and context 16,384 for 20 steps
with windows {64, 256, 1K, 4K} (16K is exact there).
"""
import os
import sys
import tempfile

from claims_common import (DATA, Results, grad_error, grad_file, measure_report_cli,
                           measured_span, replace_section, run_tracked, save_figure, train_curve)

JSON = os.path.join(DATA, "truncation.json")
PNG = os.path.join(DATA, "truncation.png")
GRAD_WINDOWS = [64, 256, 1024, 4096, 16384]
# training settings: context -> (steps, windows); the 2K run's exact model is `trained-30-steps`
TRAININGS = {2048: (30, [64, 256, 1024]), 16384: (20, [64, 256, 1024, 4096])}
MODEL = ["--hidden-size", "128", "--layers", "4", "--vocab-size", "256", "--state-size", "16"]
TRAIN = ["--seed", "0", "--threads", "2"]
CORPUS = "/usr/share/common-licenses"


def corpus_files():
    return ",".join(sorted(os.path.join(CORPUS, f) for f in os.listdir(CORPUS)
                           if os.path.isfile(os.path.join(CORPUS, f))))


def chunk_for(window):
    """A truncated backward task reads its chunk plus window - 1 rows ahead, so its cost is
    (C + Wt) / C times the exact one's: chunks as long as the window keep it at 2x. The
    truncated gradient does not depend on the chunk (to rounding)."""
    return max(256, window)


def measure(a):
    res = Results(JSON)
    build = os.path.abspath(a.build)
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        init = os.path.join(work, "init")
        run_tracked([f"{build}/cli/adjsh", "init", "--out", init, "--seed", "0", *MODEL])
        tok = os.path.join(work, "t.u32")
        run_tracked([f"{build}/cli/adjsh", "tokenize", "--text", corpus_files(), "--out", tok,
                     "--length", "65536"])
        grads(res, build, work, "init", init, tok)
        trained = None
        for context, (n, windows) in TRAININGS.items():
            for w in [0] + windows:
                have = res.has(kind="train", window=w, context=context)
                need_model = w == 0 and context == 2048 and not all(
                    res.has(kind="grad", model="trained-30-steps", window=g) for g in GRAD_WINDOWS)
                if have and not need_model:
                    continue
                steps, ck = train_curve(build, MODEL + TRAIN + [
                    "--context", str(context), "--steps", str(n)] + (
                    ["--window", str(w), "--chunk", str(chunk_for(w))] if w else []), work)
                if w == 0 and context == 2048:
                    trained = ck
                    grads(res, build, work, "trained-30-steps", trained, tok)
                if not have:
                    res.add({"kind": "train", "window": w, "context": context, "steps": steps})
                print(f"train context={context} window={w}: final loss "
                      f"{steps[-1]['loss']:.4f}", file=sys.stderr)


def grads(res, build, work, name, model, tok):
    """Error of every window's gradient against the exact one, on one model."""
    if all(res.has(kind="grad", model=name, window=w) for w in GRAD_WINDOWS):
        return
    exact = grad_file(build, model, tok, os.path.join(work, "exact.safetensors"), "--threads", "2")
    for w in GRAD_WINDOWS:
        if res.has(kind="grad", model=name, window=w):
            continue
        g = grad_file(build, model, tok, os.path.join(work, "w.safetensors"), "--threads", "2",
                      "--window", str(w), "--chunk", str(chunk_for(w)))
        e = grad_error(exact, g)
        res.add({"kind": "grad", "model": name, "window": w, "chunk": chunk_for(w),
                 "tokens": 65536, **e})
        print(f"grad {name} window={w}: rel {e['overall']['rel_l2']:.3e} "
              f"cos {e['overall']['cosine']:.6f}", file=sys.stderr)


def report(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = Results(JSON).rows
    grads = [r for r in rows if r["kind"] == "grad"]
    trains = [r for r in rows if r["kind"] == "train"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    body = []
    for name in ("init", "trained-30-steps"):
        rs = sorted((r for r in grads if r["model"] == name), key=lambda r: r["window"])
        if not rs:
            continue
        ax1.loglog([r["window"] for r in rs], [r["overall"]["rel_l2"] for r in rs], "o-",
                   label=f"{name}: overall")
        for g in ("in_proj", "A_log", "embeddings"):
            ax1.loglog([r["window"] for r in rs], [r["groups"][g]["rel_l2"] for r in rs], ".:",
                       label=f"{name}: {g}")
        groups = list(rs[0]["groups"])
        body += [f"Gradient error at T = 65,536, model `{name}`: relative L2 "
                 "||g_W - g|| / ||g|| (cosine in brackets), overall and per parameter group "
                 "(all layers together).", "",
                 "| window | overall | " + " | ".join(groups) + " |",
                 "|---|---|" + "---|" * len(groups)]
        for r in rs:
            cells = [f"{r['groups'][g]['rel_l2']:.2e} ({r['groups'][g]['cosine']:.4f})"
                     for g in groups]
            body.append(f"| {r['window']:,} | {r['overall']['rel_l2']:.2e} "
                        f"({r['overall']['cosine']:.5f}) | " + " | ".join(cells) + " |")
        body.append("")
    ax1.set_xlabel("window Wt (tokens)"), ax1.set_ylabel("relative L2 error vs exact")
    ax1.set_title("Truncated-window gradient error, T = 64K")
    for context, (n, _) in TRAININGS.items():
        runs = {r["window"]: r["steps"] for r in trains if r["context"] == context}
        if not runs:
            continue
        marks = [1, n // 3, 2 * n // 3, n]
        tail = n // 3  # the mean over the last third of the steps
        body += [f"Training at context {context:,} for {n} steps, from the same initial model on "
                 "the same data: loss per step (each step's loss is measured before its update, "
                 f"on the next {context:,} tokens).", "",
                 "| window | " + " | ".join(f"loss at step {i}" for i in marks) +
                 f" | mean of the last {tail} steps | against exact |",
                 "|---|" + "---|" * (len(marks) + 2)]
        exact = runs.get(0)
        mean = {w: sum(x["loss"] for x in s[-tail:]) / tail for w, s in runs.items()}
        for w in sorted(runs, key=lambda w: (w == 0, w)):
            s = runs[w]
            ax2.plot([x["step"] for x in s], [x["loss"] for x in s],
                     ls="-" if context == max(TRAININGS) else ":",
                     label=f"context {context // 1024}K, " + (
                         "exact" if w == 0 else f"window {w}"))
            diff = f"{mean[w] - mean[0]:+.4f}" if exact and w else "-"
            body.append(f"| {'exact' if w == 0 else f'{w:,}'} | " +
                        " | ".join(f"{s[i - 1]['loss']:.4f}" for i in marks) +
                        f" | {mean[w]:.4f} | {diff} |")
        body.append("")
    ax2.set_xlabel("step"), ax2.set_ylabel("training loss (nats/token)")
    ax2.set_title("Training, D=128 K=4: context 16K (solid) and 2K (dotted)")
    save_figure(fig, (ax1, ax2), PNG, legend_size=7, grid="both")
    head = [f"{measured_span(rows)}. Model D=128, K=4, N=16, V=256, f32, chunk "
            "256: `init` is `adjsh init --seed 0`, `trained-30-steps` the same model after the "
            "exact training run below. Tokens: the built-in corpus (`/usr/share/common-licenses`, "
            "bytes), repeated to 65,536. Training, shortened to fit the shared 2-core machine: "
            "`adjsh train`, default optimizer settings, at context 2,048 for 30 steps (a 2K "
            "window equals exact there, so windows up to 1K) and at context 16,384 for 20 "
            "steps (windows up to 4K). Truncated runs "
            "use chunks of max(256, Wt) tokens: a truncated task reads Wt - 1 rows past its "
            "chunk, so its cost is (C + Wt) / C times an exact task's.", "", "![truncation](claims/truncation.png)", ""]
    replace_section("truncation", "Claim 3: the truncated adjoint window",
                    "/usr/bin/python3 bench/claims_truncation.py measure && "
                    "/usr/bin/python3 bench/claims_truncation.py report", "\n".join(head + body))
    print("\n".join(body))


if __name__ == "__main__":
    measure_report_cli(__doc__, measure, report)
