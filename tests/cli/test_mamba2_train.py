#!/usr/bin/env python3
"""End-to-end checks of `adjsh init --model-type mamba2` and `adjsh train` on a Mamba-2 model
(train/model_family.h).

Usage:
  test_mamba2_train.py --adjsh build/cli/adjsh

Standard library only. init writes a Mamba2ForCausalLM folder (config.json with Infinity, the
same bytes for the same seed); train runs it in-process on the built-in corpus and the loss goes
down; the span schedule gives the same files on 1, 2 and 3 threads; its step-12 checkpoint,
resumed alone, ends with bitwise the straight run's files; the checkpoint is a Mamba-2 model
folder that adjsh grad, eval and generate read, with `adjsh eval` equal to adjsh grad's loss in
f64 (< 1e-12 relative) and grad showing its progress; the held-out loss is `adjsh eval`'s; a
loss mask runs and reports the accuracy; --storage bf16 runs; through 2 and 3 local workers the
files are bitwise the in-process run's, and so are a coordinator's job's (adjsh submit, 2
workers); what Mamba-2 lacks (--window), a device that cannot be used and bad shapes are
refused by name, exit 1 or 2, nothing written. Prints
PASS/FAIL per case and `N passed, N failed` last; exits 1 if any case failed.
"""
import argparse
import filecmp
import json
import math
import os
import re
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import Cluster, Results, final_files, read_scalar, run_adjsh  # noqa: E402

CRASH_MARKERS = ("Segmentation fault", "terminate called", "Aborted", "core dumped",
                 "check failed", "ADJSH_CHECK")
STEP = re.compile(r"step (\d+)/\d+ \S+ loss (\S+)")
SHAPE = ["--hidden-size", "16", "--layers", "2", "--vocab-size", "256", "--state-size", "8",
         "--head-dim", "8", "--groups", "2"]
TRAIN = ["--context", "256", "--chunk", "64", "--lr", "1e-2", "--warmup", "2"]


def losses(stderr):
    return [float(m.group(2)) for m in STEP.finditer(stderr)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    adjsh = os.path.abspath(ap.parse_args().adjsh)
    res = Results()
    check = res.record

    def run(args, timeout=300):
        return run_adjsh(adjsh, args, timeout=timeout)

    def refused(r, *words):
        return (r.returncode in (1, 2) and all(w in r.stderr for w in words)
                and not any(m in r.stderr for m in CRASH_MARKERS))

    with tempfile.TemporaryDirectory() as tmp:
        model, again = os.path.join(tmp, "m2"), os.path.join(tmp, "m2-again")
        r = run(["init", "--model-type", "mamba2", "--out", model, "--seed", "4", *SHAPE])
        check("init --model-type mamba2", r.returncode == 0, r.stderr)
        r2 = run(["init", "--model-type", "mamba2", "--out", again, "--seed", "4", *SHAPE])
        text = open(os.path.join(model, "config.json")).read()
        conf = json.loads(text)
        check("a Mamba2ForCausalLM config (num_heads = E D / P, Infinity), the same bytes for "
              "the same seed",
              r2.returncode == 0 and conf["model_type"] == "mamba2" and conf["num_heads"] == 4
              and conf["n_groups"] == 2 and "Infinity" in text
              and filecmp.cmp(os.path.join(model, "model.safetensors"),
                              os.path.join(again, "model.safetensors"), shallow=False), text)
        for args, words in [
                (["--head-dim", "5"], ("--head-dim", "does not divide")),
                (["--groups", "3"], ("n_groups",)),
                (["--dt-rank", "2"], ("--dt-rank", "Mamba-1")),
                (["--model-type", "mamba3"], ("--model-type", "mamba3"))]:
            out = os.path.join(tmp, "bad-init")
            base = SHAPE + ["--model-type", "mamba2"] if "--model-type" not in args else SHAPE
            r = run(["init", "--out", out, *base, *args])
            check(f"init {' '.join(args)} refused by name, nothing written",
                  refused(r, *words) and not os.path.exists(out), r.stderr)
        huge = os.path.join(tmp, "huge")
        r = run(["init", "--model-type", "mamba2", "--out", huge, "--hidden-size", "65536",
                 "--layers", "64", "--vocab-size", "65536"])
        check("init of a Mamba-2 model larger than memory: refused before allocating, by size",
              refused(r, "more than this machine's", "GiB") and not os.path.exists(huge),
              r.stderr)
        r = run(["init", "--out", os.path.join(tmp, "m1"), "--head-dim", "8", "--hidden-size",
                 "16", "--layers", "1", "--vocab-size", "256"])
        check("--head-dim without --model-type mamba2 refused", refused(r, "Mamba-2"), r.stderr)

        # Training: the loss goes down; a resumed run is bitwise the straight one.
        straight = os.path.join(tmp, "straight")
        r = run(["train", "--model", model, "--steps", "24", "--checkpoint-dir", straight,
                 "--checkpoint-every", "12", *TRAIN])
        ls = losses(r.stderr)
        check(f"train: 24 steps, loss {ls[0] if ls else 0:.3f} -> {ls[-1] if ls else 0:.3f}",
              r.returncode == 0 and len(ls) == 24 and "Mamba-2 model D=16" in r.stderr
              and sum(ls[-4:]) < 0.9 * sum(ls[:4]), r.stderr)
        # Its step-12 checkpoint alone in a new directory, resumed: the same final files.
        part = os.path.join(tmp, "part")
        os.makedirs(part)
        shutil.copytree(os.path.join(straight, "step-00000012"),
                        os.path.join(part, "step-00000012"))
        with open(os.path.join(part, "latest"), "w") as f:
            f.write("step-00000012")
        r2 = run(["train", "--model", model, "--steps", "24", "--checkpoint-dir", part, *TRAIN])
        check("resumed at step 12: bitwise the straight run's model and optimizer files",
              r2.returncode == 0 and "resumed at step 12" in r2.stderr
              and final_files(straight) is not None
              and final_files(part) == final_files(straight), r2.stderr)
        # The span schedule on 1, 2 and 3 threads: bitwise the same run (twice on 2).
        files = []
        for i, threads in enumerate(("1", "2", "3", "2")):
            ck = os.path.join(tmp, f"threads-{i}")
            r = run(["train", "--model", model, "--steps", "3", "--checkpoint-dir", ck,
                     "--threads", threads, "--spans", "4", *TRAIN])
            files.append(final_files(ck) if r.returncode == 0 else r.stderr)
        check("--spans 4 on 1, 2, 3 and 2 threads: bitwise the same model and optimizer files",
              files[0] is not None and all(f == files[0] for f in files), files[0])

        step = os.path.join(straight, "step-00000024")

        # The checkpoint is a model folder for grad, eval and generate.
        corpus = os.path.join(tmp, "c.u32")
        ids = [(i * 31 + i // 7) % 256 for i in range(600)]
        with open(corpus, "wb") as f:
            f.write(struct.pack(f"<{len(ids)}I", *ids))
        g = os.path.join(tmp, "g.safetensors")
        rg = run(["grad", "--model", step, "--tokens", corpus, "--dtype", "f64", "--out", g,
                  "--quiet"])
        re_ = run(["eval", "--model", step, "--tokens", corpus, "--dtype", "f64", "--quiet"])
        m = re.match(r"loss (\S+)", re_.stdout)
        got = float(m.group(1)) if m else math.nan
        want = read_scalar(g) if rg.returncode == 0 else math.nan
        check(f"the checkpoint in grad and eval (f64): {got!r} = {want!r}",
              rg.returncode == 0 and re_.returncode == 0
              and abs(got - want) <= 1e-12 * abs(want), rg.stderr + re_.stderr)
        rp = run(["grad", "--model", step, "--tokens", corpus, "--out", g])
        check("adjsh grad shows its progress: each layer forward, the head, each layer backward",
              rp.returncode == 0 and all(re.search(rf"{phase}\s+{n}/{k}", rp.stderr) for phase, n, k
                                         in (("forward", 2, 2), ("head", 1, 1),
                                             ("backward", 2, 2))), rp.stderr)
        rgen = run(["generate", "--model", step, "--prompt-tokens", corpus, "--max-new-tokens",
                    "5", "--temperature", "0"])
        check("the checkpoint generates", rgen.returncode == 0, rgen.stderr)

        # Held-out evaluation: the last step's val_loss is `adjsh eval`'s loss of the checkpoint
        # on the same data in sequences of the context (f32, the same chunked forward).
        log = os.path.join(tmp, "log.jsonl")
        ev = os.path.join(tmp, "ev")
        r = run(["train", "--model", model, "--tokens", corpus, "--val-data", corpus,
                 "--eval-every", "2", "--steps", "2", "--context", "200", "--chunk", "64",
                 "--checkpoint-dir", ev, "--log-jsonl", log])
        val = json.loads(open(log).read().splitlines()[-1]).get("val_loss") if r.returncode == 0 \
            else None
        re2 = run(["eval", "--model", os.path.join(ev, "step-00000002"), "--tokens", corpus,
                   "--context", "200", "--chunk", "64", "--quiet"])
        m = re.match(r"loss (\S+)", re2.stdout)
        want = float(m.group(1)) if m else math.nan
        check(f"train --val-data: the held-out loss {val} = adjsh eval's {want}",
              val is not None and abs(val - want) <= 1e-6 * abs(want), r.stderr + re2.stderr)

        # A loss mask.
        mask = os.path.join(tmp, "mask.u8")
        with open(mask, "wb") as f:
            f.write(bytes(1 if i % 3 == 0 else 0 for i in range(len(ids))))
        r = run(["train", "--model", model, "--tokens", corpus, "--loss-mask", mask, "--steps",
                 "2", "--context", "200", "--checkpoint-dir", os.path.join(tmp, "masked")])
        check("train --loss-mask: the accuracy on the counted targets is reported",
              r.returncode == 0 and "acc" in r.stderr, r.stderr)

        r = run(["train", "--model", model, "--steps", "2", "--storage", "bf16",
                 "--checkpoint-dir", os.path.join(tmp, "bf16"), *TRAIN])
        check("train --storage bf16 (the layer inputs kept in bf16)", r.returncode == 0, r.stderr)

        # Through local workers (the span tasks of engine/span_math.h): bitwise the
        # in-process run on threads, for 2 and 3 workers, with the held-out loss on them too.
        base = ["train", "--model", model, "--tokens", corpus, "--steps", "4", "--spans", "4",
                "--val-data", corpus, "--eval-tokens", "1024",
                "--eval-every", "2", *TRAIN]
        r = run([*base, "--checkpoint-dir", os.path.join(tmp, "w0"), "--threads", "2"])
        want = final_files(os.path.join(tmp, "w0")) if r.returncode == 0 else None
        for workers in ("2", "3"):
            ck = os.path.join(tmp, f"w{workers}")
            r2 = run([*base, "--checkpoint-dir", ck, "--workers", workers])
            got = final_files(ck) if r2.returncode == 0 else None
            check(f"train --workers {workers}: the model and optimizer files of the in-process "
                  "run, bitwise, the held-out loss reported",
                  want is not None and got == want and "val" in r2.stderr,
                  (r.stderr + r2.stderr)[-600:])

        # A coordinator's job (adjsh submit to a coordinator with 2 workers on loopback):
        # bitwise the same JobSpec run in-process by `adjsh train --spec`, the held-out loss
        # in its events.
        spec = {"model_dir": model, "token_file": corpus, "val_token_file": corpus,
                "context_length": 256, "chunk": 64, "steps": 4, "spans": 4, "eval_every": 2,
                "eval_tokens": 1024, "checkpoint_every": 0,
                "optimizer": {"lr": 1e-2, "warmup_steps": 2}}
        spec_path = os.path.join(tmp, "job.json")
        with open(spec_path, "w") as f:
            json.dump(dict(spec, checkpoint_dir=os.path.join(tmp, "j-spec")), f)
        r = run(["train", "--spec", spec_path])
        want = final_files(os.path.join(tmp, "j-spec")) if r.returncode == 0 else None
        cluster = Cluster(adjsh, tmp)
        try:
            _, addr = cluster.coordinator(os.path.join(tmp, "state"))
            for name in ("a", "b"):
                cluster.worker(addr, name)
            job, rs = cluster.submit(addr, dict(spec, checkpoint_dir=os.path.join(tmp, "j-api")))
            w = cluster.watch(addr, job, timeout=300) if job else rs
            got = final_files(os.path.join(tmp, "j-api")) if w.returncode == 0 else None
            check("a Mamba-2 JobSpec through adjsh submit (a coordinator, 2 workers): SUCCEEDED "
                  "with bitwise the files of `adjsh train --spec`",
                  want is not None and got == want, (r.stderr + rs.stderr + w.stderr)[-800:])
        finally:
            cluster.stop()

        # What Mamba-2 lacks, refused by name, nothing written.
        for args, words in [(["--workers", "1", "--worker-device", "cuda:1023"],
                             ("cuda:1023", "no worker left")),
                            (["--window", "64"], ("Mamba-2", "window")),
                            (["--schedule", "wavefront"], ("Mamba-2", "--schedule")),
                            (["--device", "cuda:1023"], ("cuda:1023",))]:
            ck = os.path.join(tmp, "refused")
            r = run(["train", "--model", model, "--steps", "2", "--checkpoint-dir", ck, *TRAIN,
                     *args])
            check(f"train {' '.join(args)} refused by name, nothing written",
                  refused(r, *words) and not os.path.exists(os.path.join(ck, "latest")),
                  r.stderr)
        # A Mamba-1 run cannot resume a Mamba-2 checkpoint directory.
        m1 = os.path.join(tmp, "m1")
        run(["init", "--out", m1, "--hidden-size", "16", "--layers", "2", "--vocab-size", "256"])
        before = final_files(straight)
        r = run(["train", "--model", m1, "--steps", "30", "--checkpoint-dir", straight, *TRAIN])
        check("a Mamba-1 run refuses a Mamba-2 checkpoint directory, nothing changed",
              refused(r, "mamba2") and final_files(straight) == before, r.stderr)
    return res.summary()


if __name__ == "__main__":
    sys.exit(main())
