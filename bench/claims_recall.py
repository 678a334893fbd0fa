#!/usr/bin/python3
"""Long-range recall: can training with the exact gradient learn what a truncated window
shorter than the distance cannot?

The task (synthetic, vocabulary 256): episodes of `distance + 2` tokens,
    BOS  v  f f f ... f  QUERY  v
with v drawn uniformly from 16 values, f from 32 filler tokens; only the last v counts in the
loss (`adjsh train --loss-mask`), so the model must carry v across `distance` tokens of noise.
Chance: accuracy 1/16, loss ln 16 = 2.77. Each step trains on fresh episodes, and the accuracy a
step reports is measured before its update: it is held-out accuracy.

  /usr/bin/python3 bench/claims_recall.py measure   # appends to docs/claims/recall.json
  /usr/bin/python3 bench/claims_recall.py report    # figure + docs/BENCHMARKS.md

Runs (model D=64, K=2, N=16, f32, warmup 10, the same initial model, the same data for the
same distance; see RUNS): distance 8,192 with the exact gradient and with --window 1024;
shorter distances (2, 8, 32, 256) as controls of what the model learns in the budget; and at
distance 32, 1,000 steps with the exact gradient and with a 16-token window; and the
curriculum of recall_curriculum.py (32 -> 256 -> 1,024 -> 8,192) in three arms.
"""
import os
import sys
import tempfile

import numpy as np

import recall_curriculum
from claims_common import (DATA, Results, measure_report_cli, measured_span, replace_section,
                           save_figure, train_curve)

JSON = os.path.join(DATA, "recall.json")
PNG = os.path.join(DATA, "recall.png")
CURRICULUM_PNG = os.path.join(DATA, "recall_curriculum.png")
BOS, QUERY = 1, 2
VALUES = np.arange(16, 32)
FILLER = np.arange(64, 96)   # 32 random filler tokens
ONE_FILLER = np.array([64])  # an easier variant: the filler is one repeated token
SHAPE = ["--hidden-size", "64", "--layers", "2", "--vocab-size", "256", "--state-size", "16",
         "--seed", "0"]
MODEL = SHAPE + ["--threads", "2", "--warmup", "10"]
FAST = ["--lr", "1e-2"]
SLOW = ["--lr", "3e-3"]
TRUNC = ["--window", "1024", "--chunk", "1024"]
# name: (distance, episodes per step, steps, extra train flags, filler tokens), in run order
RUNS = {
    "distance 256 (control), exact": (256, 32, 80, FAST, FILLER),
    "distance 8192, exact": (8192, 1, 80, FAST, FILLER),
    "distance 8192, window 1024": (8192, 1, 80, FAST + TRUNC, FILLER),
    "distance 256 (control), window 1024": (256, 32, 80, FAST + TRUNC, FILLER),
    "distance 256 (control), exact, lr 3e-3": (256, 32, 250, SLOW, FILLER),
    "one-token filler: distance 256 (control), exact, lr 3e-3": (256, 32, 200, SLOW, ONE_FILLER),
    # BOS v QUERY v: no filler, the answer is within the conv kernel's reach (W = 4).
    "distance 2 (pipeline check), exact, lr 3e-3": (2, 512, 100, SLOW, FILLER),
    "distance 8, exact, lr 3e-3": (8, 256, 150, SLOW, FILLER),
    "distance 32, exact, lr 3e-3": (32, 64, 150, SLOW, FILLER),
    "distance 32, exact, lr 3e-3, 1000 steps": (32, 64, 1000, SLOW, FILLER),
    "distance 32, window 16, lr 3e-3, 1000 steps": (32, 64, 1000, SLOW + ["--window", "16"],
                                                    FILLER),
    "distance 256, exact, lr 3e-3, 600 steps": (256, 32, 600, SLOW, FILLER),
    "one-token filler: distance 8192, exact, lr 3e-3": (8192, 4, 100, SLOW, ONE_FILLER),
    "one-token filler: distance 8192, window 1024, lr 3e-3": (8192, 4, 100, SLOW + TRUNC,
                                                              ONE_FILLER),
}


def make_data(path_tokens, path_mask, distance, episodes, filler, seed=0):
    """Writes the episodes as .u16 tokens and the byte mask (1 on each answer)."""
    rng = np.random.default_rng(seed)
    L = distance + 2
    tok = np.empty((episodes, L), np.uint16)
    tok[:, 0] = BOS
    v = rng.choice(VALUES, episodes)
    tok[:, 1] = v
    tok[:, 2:L - 2] = rng.choice(filler, (episodes, L - 4))
    tok[:, L - 2] = QUERY
    tok[:, L - 1] = v
    mask = np.zeros((episodes, L), np.uint8)
    mask[:, L - 1] = 1
    tok.tofile(path_tokens)
    mask.tofile(path_mask)


def measure(a):
    res = Results(JSON)
    build = os.path.abspath(a.build)
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        for name, (distance, per_step, steps, extra, filler) in RUNS.items():
            if res.has(run=name) or (a.only and a.only not in name):
                continue
            tok = tempfile.mktemp(suffix=".u16", dir=work)
            mask = tok.replace(".u16", ".u8")
            make_data(tok, mask, distance, per_step * steps, filler)
            context = per_step * (distance + 2)
            curve, _ = train_curve(build, MODEL + ["--tokens", tok, "--loss-mask", mask,
                                                   "--context", str(context), "--steps",
                                                   str(steps), *extra], work)
            res.add({"run": name, "distance": distance, "context": context, "steps": curve})
            acc = sum(s["correct"] for s in curve[-20:]) / sum(s["counted"] for s in curve[-20:])
            print(f"{name}: accuracy over the last 20 steps {acc:.3f}", file=sys.stderr)
        recall_curriculum.measure(build, work, res, make_data, SHAPE, FILLER, a.only)


def report(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in Results(JSON).rows if "curriculum" not in r]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    body = ["| run | context | steps | answers seen | accuracy, first 20 steps | accuracy, last 20 "
            "steps | answer loss, last 20 steps |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["steps"]
        k = 10  # moving window in steps
        acc = [sum(x["correct"] for x in s[max(0, i - k + 1):i + 1]) /
               sum(x["counted"] for x in s[max(0, i - k + 1):i + 1]) for i in range(len(s))]
        color = plt.cm.tab20(len(ax1.lines) % 20)
        wide = 2.2 if "1000 steps" in r["run"] else 0.9  # the exact-against-window pair
        ax1.plot([x["step"] for x in s], acc, label=r["run"], color=color, lw=wide)
        ax2.plot([x["step"] for x in s], [x["loss"] for x in s], label=r["run"], color=color,
                 lw=wide * 0.8)
        first, last = s[:20], s[-20:]
        body.append(f"| {r['run']} | {r['context']:,} | {len(s)} | "
                    f"{sum(x['counted'] for x in s):,} | "
                    f"{sum(x['correct'] for x in first) / sum(x['counted'] for x in first):.3f} | "
                    f"{sum(x['correct'] for x in last) / sum(x['counted'] for x in last):.3f} | "
                    f"{sum(x['loss'] for x in last) / len(last):.3f} |")
    ax1.axhline(1 / 16, color="grey", lw=0.8)
    ax1.text(1, 1 / 16 + 0.01, "chance", color="grey")
    ax1.set_xlabel("step"), ax1.set_ylabel("answer accuracy (moving mean of 10 steps)")
    ax1.set_title("Recall of a value seen `distance` tokens back (held-out)")
    ax2.axhline(np.log(16), color="grey", lw=0.8)
    ax2.set_xlabel("step"), ax2.set_ylabel("loss on the answer tokens (nats)")
    ax2.set_ylim(0, 6)
    save_figure(fig, (ax1, ax2), PNG)
    head = [f"{measured_span(Results(JSON).rows)}. Task: episodes `BOS v f...f QUERY v`, v one of "
            "16 values, f random filler from 32 tokens (or, in the runs named one-token filler, "
            "one repeated token); only the final v counts (`adjsh train --loss-mask`), so the "
            "answer sits `distance` tokens after the value; context = episodes per step x "
            "(distance + 2). Each step is "
            "fresh episodes; its accuracy is measured before its update (held-out). Model D=64, "
            "K=2, N=16 (`--seed 0`), f32, warmup 10 steps then cosine decay, lr 1e-2 unless "
            "named, the same initial model and data in runs of the same distance. Chance: "
            "accuracy 0.0625, loss 2.77.", "", "![recall](claims/recall.png)", ""]
    curriculum = recall_curriculum.report(Results(JSON).rows, CURRICULUM_PNG)
    if curriculum:
        stages = " -> ".join(f"{d:,} ({e} episodes x {n} steps)"
                             for d, e, n, _ in recall_curriculum.STAGES)
        body += ["", "**By curriculum** (bench/recall_curriculum.py): the distance grows stage "
                 f"by stage, {stages}, each stage `adjsh train --model` from the last stage's "
                 "weights (lr 3e-3, warmup 10, cosine within the stage), the same data in every "
                 "arm. Arms: the exact gradient throughout; the stages up to 1,024 shared with "
                 "it and the 8,192 stage with a 1,024-token window; a window of half the "
                 "distance at every stage (its gradient never spans value to answer). Accuracy "
                 "over the first and the last 20 steps of each stage (held-out), the stage's "
                 "gradient in brackets:", "",
                 "![recall by curriculum](claims/recall_curriculum.png)", ""] + curriculum
    replace_section("recall", "Claim 5: long-range recall, exact against truncated",
                    "/usr/bin/python3 bench/claims_recall.py measure && "
                    "/usr/bin/python3 bench/claims_recall.py report", "\n".join(head + body))
    print("\n".join(body))


def extra_flags(ap):
    ap.add_argument("--only", default="", help="run only the runs whose name contains this")

if __name__ == "__main__":
    measure_report_cli(__doc__, measure, report, extra_flags)
