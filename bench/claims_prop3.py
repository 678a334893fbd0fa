#!/usr/bin/python3
"""The paper's Proposition 3 read literally (every layer given the top-of-stack cotangent
dL/du^{K+1}, its input fixed; docs/MATH.md "The adjoint of the scan") against the exact gradient:
  * gradient error (relative L2, cosine; overall and per parameter group) of
    `adjsh grad --cotangent top-of-stack` for K = 1..8 layers (fresh models, D=128, T=8K);
  * training with it (`adjsh train --cotangent top-of-stack`) against exact: loss per step.

  /usr/bin/python3 bench/claims_prop3.py measure   # appends to docs/claims/prop3.json
  /usr/bin/python3 bench/claims_prop3.py report    # figure + docs/BENCHMARKS.md

Gradient errors: D=128, N=16, V=256, seed 0, T = 8,192 tokens of the built-in corpus, f32.
Training: D=128, K=4, context 2,048, 120 steps, default optimizer settings; the gradient error
is also measured on the model the exact run ends with.
"""
import os
import sys
import tempfile

from claims_common import (DATA, Results, grad_error, grad_file, measure_report_cli,
                           measured_span, replace_section, run_tracked, save_figure, train_curve)
from claims_truncation import MODEL, TRAIN, corpus_files

JSON = os.path.join(DATA, "prop3.json")
PNG = os.path.join(DATA, "prop3.png")
LAYERS = range(1, 9)
LONG = 120  # training steps of the comparison (context 2,048)


def measure(a):
    res = Results(JSON)
    build = os.path.abspath(a.build)
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        tok = os.path.join(work, "t.u32")
        run_tracked([f"{build}/cli/adjsh", "tokenize", "--text", corpus_files(), "--out", tok,
                     "--length", "8192"])
        for K in LAYERS:
            if res.has(kind="grad", layers=K):
                continue
            model = os.path.join(work, f"m{K}")
            run_tracked([f"{build}/cli/adjsh", "init", "--out", model, "--seed", "0",
                         "--hidden-size", "128", "--layers", str(K), "--vocab-size", "256",
                         "--state-size", "16"])
            exact = grad_file(build, model, tok, os.path.join(work, "e.safetensors"),
                              "--threads", "2")
            top = grad_file(build, model, tok, os.path.join(work, "t.safetensors"),
                            "--threads", "2", "--cotangent", "top-of-stack")
            e = grad_error(exact, top)
            per_layer = {}
            for k in range(K):
                pre = f"backbone.layers.{k}."
                sub = lambda g: {n: v for n, v in g.items() if n.startswith(pre)}  # noqa: E731
                per_layer[k] = grad_error(sub(exact), sub(top))["overall"]
            res.add({"kind": "grad", "layers": K, "tokens": 8192, **e, "per_layer": per_layer})
            print(f"K={K}: rel {e['overall']['rel_l2']:.3e} cos {e['overall']['cosine']:.4f}",
                  file=sys.stderr)
        for name, extra in (("exact", []), ("top-of-stack", ["--cotangent", "top-of-stack"])):
            if res.has(kind="train", cotangent=name, length=LONG):
                continue
            steps, ck = train_curve(build, MODEL + TRAIN + ["--steps", str(LONG)] + extra, work)
            res.add({"kind": "train", "cotangent": name, "length": LONG, "steps": steps})
            print(f"train {name}: final loss {steps[-1]['loss']:.4f}", file=sys.stderr)
            if name == "exact" and not res.has(kind="grad-trained"):
                # The error on the trained model (its weights no longer at the init's scale).
                exact = grad_file(build, ck, tok, os.path.join(work, "e.safetensors"),
                                  "--threads", "2")
                top = grad_file(build, ck, tok, os.path.join(work, "t.safetensors"),
                                "--threads", "2", "--cotangent", "top-of-stack")
                res.add({"kind": "grad-trained", "layers": 4, "tokens": 8192,
                         "trained_steps": LONG, **grad_error(exact, top)})


def report(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = Results(JSON).rows
    grads = sorted((r for r in rows if r["kind"] == "grad"), key=lambda r: r["layers"])
    trains = {}  # the longest run of each cotangent
    for r in rows:
        if r["kind"] == "train" and len(r["steps"]) >= len(trains.get(r["cotangent"], [])):
            trains[r["cotangent"]] = r["steps"]
    trained = [r for r in rows if r["kind"] == "grad-trained"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    body = []
    if grads:
        ks = [r["layers"] for r in grads]
        ax1.plot(ks, [r["overall"]["rel_l2"] for r in grads], "o-", label="relative L2, overall")
        ax1.plot(ks, [1 - r["overall"]["cosine"] for r in grads], "s--", label="1 - cosine, overall")
        ax1.plot(ks, [r["per_layer"]["0"]["rel_l2"] for r in grads], ".:",
                 label="relative L2, layer 1 (bottom)")
        ax1.set_xlabel("layers K"), ax1.set_ylabel("error vs exact")
        ax1.set_title("Top-of-stack cotangent (Proposition 3), fresh models, T = 8K")
        groups = list(grads[-1]["groups"])
        body += ["Gradient error of `--cotangent top-of-stack` against exact, fresh models "
                 "(`adjsh init --seed 0`), relative L2 (cosine in brackets); per layer: layer 1 "
                 "is the bottom, layer K (the top) is exact by construction.", "",
                 "| K | overall | bottom layer | " + " | ".join(groups) + " |",
                 "|---|---|---|" + "---|" * len(groups)]
        for r in grads:
            cells = [f"{r['groups'][g]['rel_l2']:.2e} ({r['groups'][g]['cosine']:.3f})"
                     if g in r["groups"] else "-" for g in groups]
            b = r["per_layer"]["0"]
            body.append(f"| {r['layers']} | {r['overall']['rel_l2']:.2e} "
                        f"({r['overall']['cosine']:.4f}) | {b['rel_l2']:.2e} ({b['cosine']:.3f}) | "
                        + " | ".join(cells) + " |")
        body.append("")
    for r in trained:
        body += [f"On the K=4 model after the {r['trained_steps']}-step exact training run below "
                 f"(T = 8,192): relative L2 {r['overall']['rel_l2']:.2e}, cosine "
                 f"{r['overall']['cosine']:.4f}; per group: " +
                 ", ".join(f"{g} {v['rel_l2']:.2e}" for g, v in r["groups"].items()) + ".", ""]
    if trains:
        n = min(len(s) for s in trains.values())
        marks = [1] + [i for i in range(n // 4, n + 1, n // 4)][:4]
        body += [f"Training D=128, K=4, context 2,048, {n} steps (lr 3e-3, warmup 10, cosine), "
                 "from the same initial model on the same data (the built-in corpus):", "",
                 "| cotangent | " + " | ".join(f"loss at step {i}" for i in marks) +
                 " | mean of the last 10 steps |", "|---|" + "---|" * (len(marks) + 1)]
        for name, s in sorted(trains.items()):
            ax2.plot([x["step"] for x in s], [x["loss"] for x in s], label=name, lw=0.9)
            last = [x["loss"] for x in s[n - 10:n]]
            body.append(f"| {name} | " + " | ".join(f"{s[i - 1]['loss']:.4f}" for i in marks)
                        + f" | {sum(last) / len(last):.4f} |")
    ax2.set_xlabel("step"), ax2.set_ylabel("training loss (nats/token)")
    ax2.set_title("Training with each cotangent, D=128 K=4, context 2K")
    save_figure(fig, (ax1, ax2), PNG)
    head = [f"{measured_span(rows)}. `--cotangent top-of-stack` gives every "
            "layer the cotangent dL/du^{K+1} at the top of the residual stack with its input "
            "held fixed (so the paths through later layers' norms and SSMs are left out), which "
            "makes all layers independent. Tests: tests/kernels/engine_options_test.cc (K = 1 "
            "is exact; the top layer is exact; exact when the layers above are identities) and "
            "tests/torch/test_top_of_stack.py (the same definition in PyTorch autograd, f64).",
            "", "![Proposition 3](claims/prop3.png)", ""]
    replace_section("prop3", "Claim 4: Proposition 3 (top-of-stack cotangent)",
                    "/usr/bin/python3 bench/claims_prop3.py measure && "
                    "/usr/bin/python3 bench/claims_prop3.py report", "\n".join(head + body))
    print("\n".join(body))


if __name__ == "__main__":
    measure_report_cli(__doc__, measure, report)
