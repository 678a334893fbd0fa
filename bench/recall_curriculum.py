"""Long-range recall by curriculum (claim 5, measured and reported through claims_recall.py).

From scratch, neither gradient teaches a small model to recall a value 8K tokens back within
a budget 2 cores can run (claims_recall.py). A curriculum does: the distance grows stage by
stage (32 -> 256 -> 1,024 -> 8,192), each stage an `adjsh train --model` run from the last
stage's weights. Three arms, the same initial model and the same data in every arm:

  exact                 the exact gradient at every stage;
  window 1024, last     the stages up to 1,024 shared with `exact` (run once), the 8,192 stage
                        with a 1,024-token window: can a window shorter than the distance
                        keep up once recall has been learned at distances it covers?
  window = distance/2   a window half the distance at every stage: the gradient never spans
                        the way from the value to the answer.

Every step's accuracy is measured on fresh episodes before its update (held-out).
"""
import os
import shutil
import sys
import tempfile

from claims_common import train_curve

# (distance, episodes per step, steps, data seed); the arms share the data of each stage
STAGES = [(32, 64, 1000, 101), (256, 32, 300, 102), (1024, 8, 300, 103), (8192, 4, 300, 104)]
LR = ["--lr", "3e-3", "--warmup", "10", "--threads", "2"]


def window(w):
    return ["--window", str(w), "--chunk", str(max(256, w))]


# arm: a function of the stage's distance giving its extra `adjsh train` flags
ARMS = {
    "exact": lambda d: [],
    "window 1024 at the last stage": lambda d: window(1024) if d > 1024 else [],
    "window = distance / 2 at every stage": lambda d: window(d // 2),
}


def run_name(arm):
    return "curriculum 32 -> 256 -> 1024 -> 8192, " + arm


def measure(build, work, res, make_data, model_flags, filler, only=""):
    """Runs the arms not yet in res (a claims_common.Results); a stage whose flags and starting
    weights equal an arm's already run is not run again."""
    done = {}  # (arm flags of stages 0..i) -> (curve, model dir)
    keep = tempfile.mkdtemp(dir=work)
    for arm, flags in ARMS.items():
        name = run_name(arm)
        if res.has(run=name) or (only and only not in name):
            continue
        steps, stages, model, key = [], [], None, ()
        for i, (distance, per_step, n, seed) in enumerate(STAGES):
            key += (tuple(flags(distance)),)
            if key not in done:
                tok = os.path.join(work, f"stage{i}.u16")
                mask = tok.replace(".u16", ".u8")
                make_data(tok, mask, distance, per_step * n, filler, seed=seed)
                start = ["--model", model] if model else model_flags
                curve, ck = train_curve(build, start + LR + [
                    "--tokens", tok, "--loss-mask", mask, "--context",
                    str(per_step * (distance + 2)), "--steps", str(n), *flags(distance)], work)
                kept = os.path.join(keep, f"{len(done)}")
                shutil.copytree(ck, kept)
                done[key] = (curve, kept)
                acc = (sum(s["correct"] for s in curve[-20:]) /
                       sum(s["counted"] for s in curve[-20:]))
                print(f"{name}: distance {distance}: accuracy over the last 20 steps "
                      f"{acc:.3f}", file=sys.stderr)
            curve, model = done[key]
            stages.append({"distance": distance, "context": per_step * (distance + 2),
                           "first": len(steps), "steps": len(curve),
                           "flags": " ".join(flags(distance)) or "exact"})
            steps += [dict(s, step=len(steps) + j + 1) for j, s in enumerate(curve)]
        res.add({"run": name, "curriculum": stages, "steps": steps})


def acc(steps):
    return sum(s["correct"] for s in steps) / sum(s["counted"] for s in steps)


def report(rows, png):
    """Draws the arms into png; returns the markdown table."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if "curriculum" in r]
    if not rows:
        return []
    fig, ax = plt.subplots(figsize=(13, 4.5))
    k = 20  # moving window in steps
    for r in rows:
        s = r["steps"]
        arm = r["run"].split(", ", 1)[1]
        shared = " (the stages before it are exact's)" if "last stage" in arm else ""
        ax.plot([x["step"] for x in s],
                [acc(s[max(0, i - k + 1):i + 1]) for i in range(len(s))], label=arm + shared)
    for st in rows[0]["curriculum"]:
        ax.axvline(st["first"], color="grey", lw=0.8, ls="--")
        ax.text(st["first"] + 5, 1.02, f"distance {st['distance']:,}", color="grey")
    ax.axhline(1 / 16, color="grey", lw=0.8)
    ax.set_ylim(0, 1.08)
    ax.set_xlabel("step (all stages)")
    ax.set_ylabel(f"answer accuracy (moving mean of {k} steps)")
    ax.set_title("Recall by curriculum: each stage starts from the last stage's weights")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    st0 = rows[0]["curriculum"]
    head = ("| arm | " + " | ".join(f"distance {st['distance']:,}: first 20 / last 20 steps"
                                     for st in st0) + " |")
    body = [head, "|---|" + "---|" * len(st0)]
    for r in rows:
        cells = []
        for st in r["curriculum"]:
            s = r["steps"][st["first"]:st["first"] + st["steps"]]
            cells.append(f"{acc(s[:20]):.3f} / **{acc(s[-20:]):.3f}** ({st['flags']})")
        body.append(f"| {r['run'].split(', ', 1)[1]} | " + " | ".join(cells) + " |")
    return body
