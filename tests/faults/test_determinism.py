#!/usr/bin/env python3
"""Determinism stress: results through local workers are bitwise those of the in-process engine.

  test_determinism.py --adjsh build/cli/adjsh [--repeats 12] [--keep]

For each shape below, `adjsh grad --workers W` and `adjsh train --workers W` (5 steps) run
--repeats times each, W cycling through 1, 2, 4, 8, and every gradient file, and every final model
and optimizer state, is compared byte for byte with the in-process run (`--workers 0`, the same
span schedule on threads). The shapes stress what a task's result could wrongly depend on: 64 spans
of many chunks of a tiny width (more spans than workers: owners hold several; short rows: vector
loops that are all remainder), an uneven last chunk (with N = 16, the fixed-width scan), one-token
chunks (a span's conv halo spans several chunks), and a chunk longer than the sequence (one span),
and an untied LM head. Spans go to whichever workers claim them, in an order that changes from run
to run, so a result that depends on which worker ran a task, on what it ran before, or on when a
result arrived shows up here as a differing byte. Runs alternate, four at a time, between the
worker tree (--reduce tree: the partials summed among the workers, each run's progress lines must
say "tree of") and the star (--reduce star: all through the coordinator, no "tree of"). Mamba-2
models (MAMBA2_SHAPES) go through the same workers, grad and train, tree and star alike.
"""
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import final_files, run_adjsh, run_process_test  # noqa: E402

CORPUS = "/usr/share/common-licenses/GPL-3"

# name: (model shape flags, context T, chunk C, spans S (0: the default), train steps)
SHAPES = {
    "tiny width, 256 chunks, 64 spans": (["--hidden-size", "8", "--layers", "4",
                                          "--state-size", "4"], 8192, 32, 64, 5),
    "uneven last chunk, N=16": (["--hidden-size", "16", "--layers", "2", "--state-size", "16"],
                                1000, 96, 0, 5),
    "one-token chunks": (["--hidden-size", "8", "--layers", "2", "--state-size", "4"], 64, 1,
                         0, 5),
    "chunk longer than T": (["--hidden-size", "12", "--layers", "3", "--state-size", "3"],
                            300, 512, 0, 5),
    # lm_head.weight of its own: shipped to the workers with the other parameters (a star step
    # once left it out, and its workers skipped every task).
    "untied head": (["--hidden-size", "8", "--layers", "2", "--state-size", "4",
                     "--untied-head"], 500, 64, 0, 3),
}
WORKERS = [1, 2, 4, 8]

# Mamba-2 models (adjsh init --model-type mamba2), `adjsh grad --workers W` and `adjsh train
# --workers W` (3 steps), by the tree and the star in turn: name: (flags, T, C, S).
MAMBA2_SHAPES = {
    "Mamba-2, G=2, 16 spans": (["--hidden-size", "16", "--layers", "2", "--state-size", "8",
                                "--head-dim", "4", "--groups", "2"], 2000, 32, 16),
    "Mamba-2, one-token chunks": (["--hidden-size", "8", "--layers", "2", "--state-size", "4",
                                   "--head-dim", "4"], 64, 1, 0),
}


def digest(files):
    return {name: hashlib.sha256(data).hexdigest()[:16] for name, data in files.items()}


def mamba2_body(adjsh, tmp, record, repeats):
    for s, (name, (shape_flags, T, C, S)) in enumerate(MAMBA2_SHAPES.items()):
        d = os.path.join(tmp, f"mamba2-{s}")
        os.makedirs(d)
        model, tokens = os.path.join(d, "model"), os.path.join(d, "tokens.u32")
        r = run_adjsh(adjsh, ["init", "--out", model, "--model-type", "mamba2", "--vocab-size",
                              "256", "--seed", str(s), *shape_flags])
        r2 = run_adjsh(adjsh, ["tokenize", "--text", CORPUS, "--out", tokens, "--length", str(T)])
        if not record(f"{name}: model and tokens", r.returncode == 0 and r2.returncode == 0,
                      r.stderr + r2.stderr):
            continue
        grad = ["grad", "--model", model, "--tokens", tokens, "--chunk", str(C), "--spans", str(S)]
        train = ["train", "--model", model, "--tokens", tokens, "--context", str(T), "--chunk",
                 str(C), "--spans", str(S), "--steps", "3", "--warmup", "1",
                 "--checkpoint-every", "0"]
        ref_grad = os.path.join(d, "g0.safetensors")
        r = run_adjsh(adjsh, [*grad, "--threads", "2", "--out", ref_grad])
        r2 = run_adjsh(adjsh, [*train, "--threads", "2", "--checkpoint-dir",
                               os.path.join(d, "ckpt0")], timeout=300)
        ref_state = final_files(os.path.join(d, "ckpt0")) if r2.returncode == 0 else None
        if not record(f"{name}: in-process grad and train", r.returncode == 0 and ref_state,
                      r.stderr + r2.stderr):
            continue
        with open(ref_grad, "rb") as f:
            want_grad = f.read()
        bad, bad_train, failed = [], [], []
        for i in range(repeats):
            workers = str(WORKERS[i % len(WORKERS)])
            # Tree and star in turn; train in half the rounds of 1, 2, 4, 8 workers, one of
            # each reduction.
            reduce = "star" if (i // len(WORKERS)) % 2 else "tree"
            out = os.path.join(d, f"g{i + 1}.safetensors")
            r = run_adjsh(adjsh, [*grad, "--workers", workers, "--reduce", reduce, "--out", out],
                          timeout=300)
            if r.returncode != 0 or ("tree of " in r.stderr) != (reduce == "tree"):
                failed.append(f"grad --workers {workers} --reduce {reduce}: "
                              f"{r.stderr.strip()[-300:]}")
                continue
            with open(out, "rb") as f:
                if f.read() != want_grad:
                    bad.append(f"run {i + 1} ({workers} workers, {reduce})")
            os.remove(out)
            if (i // (2 * len(WORKERS))) % 2:
                continue
            ckpt = os.path.join(d, f"ckpt{i + 1}")
            r = run_adjsh(adjsh, [*train, "--workers", workers, "--reduce", reduce,
                                  "--checkpoint-dir", ckpt], timeout=300)
            state = final_files(ckpt) if r.returncode == 0 else None
            if state is None or ("tree of " in r.stderr) != (reduce == "tree"):
                failed.append(f"train --workers {workers} --reduce {reduce}: "
                              f"{r.stderr.strip()[-300:]}")
            elif state != ref_state:
                bad_train.append(f"run {i + 1} ({workers} workers, {reduce})")
        trains = sum(1 for i in range(repeats) if (i // (2 * len(WORKERS))) % 2 == 0)
        record(f"{name}: {repeats} grad and {trains} train runs through 1, 2, 4, 8 "
               "workers ran (tree and star)", not failed, "; ".join(failed))
        record(f"{name}: every gradient bitwise the in-process one", not bad, "; ".join(bad))
        record(f"{name}: every final model and optimizer state bitwise in-process",
               not bad_train, "; ".join(bad_train))


def body(adjsh, tmp, cluster, record, repeats):
    del cluster  # adjsh starts and stops its own local workers
    mamba2_body(adjsh, tmp, record, repeats)
    for s, (name, (shape_flags, T, C, S, steps)) in enumerate(SHAPES.items()):
        d = os.path.join(tmp, f"shape{s}")
        os.makedirs(d)
        model, tokens = os.path.join(d, "model"), os.path.join(d, "tokens.u32")
        r = run_adjsh(adjsh, ["init", "--out", model, "--vocab-size", "256", "--seed", str(s),
                              *shape_flags])
        r2 = run_adjsh(adjsh, ["tokenize", "--text", CORPUS, "--out", tokens, "--length", str(T)])
        if not record(f"{name}: model and tokens", r.returncode == 0 and r2.returncode == 0,
                      r.stderr + r2.stderr):
            continue
        grad = ["grad", "--model", model, "--tokens", tokens, "--chunk", str(C), "--spans", str(S)]
        train = ["train", "--model", model, "--tokens", tokens, "--context", str(T), "--chunk",
                 str(C), "--spans", str(S), "--steps", str(steps), "--warmup", "1",
                 "--checkpoint-every", "0"]

        ref_grad = os.path.join(d, "g0.safetensors")
        r = run_adjsh(adjsh, [*grad, "--out", ref_grad])
        ref_ckpt = os.path.join(d, "ckpt0")
        r2 = run_adjsh(adjsh, [*train, "--checkpoint-dir", ref_ckpt], timeout=300)
        ref_state = final_files(ref_ckpt) if r2.returncode == 0 else None
        if not record(f"{name}: in-process grad and train", r.returncode == 0 and ref_state,
                      r.stderr + r2.stderr):
            continue
        with open(ref_grad, "rb") as f:
            want_grad = f.read()

        bad_grad, bad_train, failed = [], [], []
        for i in range(repeats):
            workers = str(WORKERS[i % len(WORKERS)])
            reduce = "star" if (i // len(WORKERS)) % 2 else "tree"
            out = os.path.join(d, f"g{i + 1}.safetensors")
            r = run_adjsh(adjsh, [*grad, "--workers", workers, "--reduce", reduce, "--out", out],
                          timeout=300)
            if r.returncode != 0:
                failed.append(f"grad --workers {workers}: {r.stderr.strip()[-300:]}")
            elif ("tree of " in r.stderr) != (reduce == "tree"):
                failed.append(f"grad --workers {workers} --reduce {reduce}: the progress line "
                              f"says otherwise: {r.stderr.strip()[-200:]}")
            else:
                with open(out, "rb") as f:
                    if f.read() != want_grad:
                        bad_grad.append(f"run {i + 1} ({workers} workers)")
                os.remove(out)
            ckpt = os.path.join(d, f"ckpt{i + 1}")
            r = run_adjsh(adjsh, [*train, "--workers", workers, "--reduce", reduce,
                                  "--checkpoint-dir", ckpt], timeout=300)
            state = final_files(ckpt) if r.returncode == 0 else None
            if state is None:
                failed.append(f"train --workers {workers}: {r.stderr.strip()[-300:]}")
            elif ("tree of " in r.stderr) != (reduce == "tree"):
                failed.append(f"train --workers {workers} --reduce {reduce}: the progress lines "
                              f"say otherwise: {r.stderr.strip()[-200:]}")
            elif state != ref_state:
                bad_train.append(f"run {i + 1} ({workers} workers): {digest(state)} vs "
                                 f"{digest(ref_state)}")
        record(f"{name}: {repeats} grad and {repeats} train runs through 1, 2, 4, 8 workers "
               "(tree and star) ran",
               not failed, "; ".join(failed))
        record(f"{name}: every gradient bitwise the in-process one", not bad_grad,
               "; ".join(bad_grad))
        record(f"{name}: every final model and optimizer state bitwise in-process", not bad_train,
               "; ".join(bad_train))


def main():
    repeats = 12
    if "--repeats" in sys.argv:
        k = sys.argv.index("--repeats")
        repeats = int(sys.argv[k + 1])
        del sys.argv[k:k + 2]
    run_process_test("adjsh_determinism_",
                     lambda adjsh, tmp, cluster, record: body(adjsh, tmp, cluster, record,
                                                              repeats))


if __name__ == "__main__":
    main()
