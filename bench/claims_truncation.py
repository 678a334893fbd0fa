#!/usr/bin/python3
"""The truncated adjoint window (DESIGN.md §3) against the exact gradient:
  * gradient error (relative L2 and cosine, overall and per parameter group) of
    `adjsh grad --window Wt` for Wt in {64, 256, 1K, 4K, 16K} at T = 64K, on the freshly
    initialised model and on the same model after the exact training run below;
  * training: `adjsh train --window Wt` against exact from the same initial model, the same
    steps and data (the built-in corpus); loss per step.

  /usr/bin/python3 bench/claims_truncation.py measure   # appends to docs/claims/truncation.json
  /usr/bin/python3 bench/claims_truncation.py report    # figure + docs/BENCHMARKS.md

Model D=128, K=4, N=16, V=256 (seed 0), f32, chunk 256. Training (shortened to fit a shared
2-core machine): context 2,048, 30 steps, lr 3e-3 (the defaults of `adjsh train`), windows
{64, 256, 1K}: a 2K window is exact at this context.
"""
import os
import sys
import tempfile

from claims_common import (DATA, ROOT, Results, grad_error, grad_file, measure_report_cli,
                           replace_section, run_tracked, train_curve)

JSON = os.path.join(DATA, "truncation.json")
PNG = os.path.join(DATA, "truncation.png")
GRAD_WINDOWS = [64, 256, 1024, 4096, 16384]
TRAIN_WINDOWS = [64, 256, 1024]
MODEL = ["--hidden-size", "128", "--layers", "4", "--vocab-size", "256", "--state-size", "16"]
TRAIN = ["--context", "2048", "--steps", "30", "--seed", "0", "--threads", "2"]
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
        for w in [0] + TRAIN_WINDOWS:
            if res.has(kind="train", window=w) and w != 0:
                continue
            steps, ck = train_curve(build, MODEL + TRAIN + (
                ["--window", str(w), "--chunk", str(chunk_for(w))] if w else []), work)
            if w == 0:
                trained = ck
            if not res.has(kind="train", window=w):
                res.add({"kind": "train", "window": w, "steps": steps})
            print(f"train window={w}: final loss {steps[-1]['loss']:.4f}", file=sys.stderr)
        grads(res, build, work, "trained-30-steps", trained, tok)


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
    trains = {r["window"]: r["steps"] for r in rows if r["kind"] == "train"}
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
    if trains:
        body += ["Training from the same initial model on the same data: loss per step "
                 "(each step's loss is measured before its update, on the next 2,048 tokens).", "",
                 "| window | loss at step 1 | step 10 | step 20 | step 30 | mean of steps 21-30 |",
                 "|---|---|---|---|---|---|"]
        for w in sorted(trains, key=lambda w: (w == 0, w)):
            s = trains[w]
            ax2.plot([x["step"] for x in s], [x["loss"] for x in s],
                     label="exact" if w == 0 else f"window {w}")
            last = [x["loss"] for x in s[20:30]]
            body.append(f"| {'exact' if w == 0 else f'{w:,}'} | " +
                        " | ".join(f"{s[i - 1]['loss']:.4f}" for i in (1, 10, 20, 30)) +
                        f" | {sum(last) / len(last):.4f} |")
    ax2.set_xlabel("step"), ax2.set_ylabel("training loss (nats/token)")
    ax2.set_title("Training, context 2K, D=128 K=4")
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PNG, dpi=110)
    when = sorted(r["measured_utc"] for r in rows)
    head = [f"Measured {when[0]} to {when[-1]} UTC. Model D=128, K=4, N=16, V=256, f32, chunk "
            "256: `init` is `adjsh init --seed 0`, `trained-30-steps` the same model after the "
            "exact training run below. Tokens: the built-in corpus (`/usr/share/common-licenses`, "
            "bytes), repeated to 65,536. Training, shortened to fit the shared 2-core machine: "
            "`adjsh train` context 2,048, 30 steps, default optimizer settings; a 2K window "
            "equals exact at that context, so training compares windows up to 1K. Truncated runs "
            "use chunks of max(256, Wt) tokens: a truncated task reads Wt - 1 rows past its "
            "chunk, so its cost is (C + Wt) / C times an exact task's.", "", "![truncation](claims/truncation.png)", ""]
    replace_section("truncation", "Claim 3: the truncated adjoint window",
                    "/usr/bin/python3 bench/claims_truncation.py measure && "
                    "/usr/bin/python3 bench/claims_truncation.py report", "\n".join(head + body))
    print("\n".join(body))


if __name__ == "__main__":
    measure_report_cli(__doc__, measure, report)
