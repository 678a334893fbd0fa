#!/usr/bin/env python3
"""`adjsh train` on prepared data and batches, from the command line (standard library only:
the prepared files are written here in adjsh prepare's format, scripts/adjsh_data.py).

Usage:
  test_data_cli.py --adjsh build/cli/adjsh

  * --data PREFIX.json trains on the train split and evaluates on the held-out one;
  * a tokenizer vocabulary larger than the model's, a truncated document index, a token file
    shorter than its manifest, a manifest of another format: each a message naming the problem,
    exit 1, no checkpoint written;
  * a resume with a changed context or batch is refused naming the field, nothing changed;
  * --batch-size 2: the weights through 2 local workers equal the in-process ones byte for byte
    (checked twice), and differ from --batch-size 1's;
  * the held-out loss through workers is bitwise the same for 1, 2 and 3 of them, and the
    in-process one to f32 rounding;
  * one job definition: a JobSpec run by `adjsh train --spec` and by a coordinator (adjsh
    submit, a worker on loopback) trains the weights of `adjsh train` with the same flags.
Prints PASS/FAIL per case and `N passed, N failed`; exits 1 on any failure.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

from test_cli import st_read, st_tensor_bytes, st_write  # tests/cli/test_cli.py

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import Cluster, Results  # noqa: E402

V = 40


def run(adjsh, args, timeout=300):
    p = subprocess.run([adjsh] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def write_split(prefix, name, docs, eos):
    """PREFIX.<name>.u16 and .docs for documents (lists of ids), EOS between them."""
    ids, starts = [], []
    for i, d in enumerate(docs):
        if i:
            ids.append(eos)
        starts.append(len(ids))
        ids.extend(d)
    with open(f"{prefix}.{name}.u16", "wb") as f:
        f.write(struct.pack(f"<{len(ids)}H", *ids))
    with open(f"{prefix}.{name}.docs", "wb") as f:
        f.write(struct.pack(f"<{len(starts)}Q", *starts))
    base = os.path.basename(prefix)
    return {"file": f"{base}.{name}.u16", "docs": f"{base}.{name}.docs", "tokens": len(ids),
            "documents": len(docs)}


def write_prepared(prefix, vocab=V):
    docs = [[(7 * i + j * 3 + i // 5) % (V - 1) for j in range(150 + 13 * i)] for i in range(40)]
    manifest = {"format": "adjsh-tokens-1", "tokenizer": "/nowhere/tokenizer.json",
                "tokenizer_sha256": "0" * 64, "vocab_size": vocab, "eos_id": V - 1,
                "dtype": "u16", "text_field": "text", "seed": 0, "val_fraction": 0.1,
                "inputs": [], "skipped_files": 0,
                "train": write_split(prefix, "train", docs[:36], V - 1),
                "val": write_split(prefix, "val", docs[36:], V - 1)}
    with open(prefix + ".json", "w") as f:
        json.dump(manifest, f)
    return manifest


def digest(ck):
    step = os.path.join(ck, open(os.path.join(ck, "latest")).read().strip())
    h = hashlib.sha256()
    for name in ("model.safetensors", "optimizer.safetensors"):
        h.update(open(os.path.join(step, name), "rb").read())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    a = ap.parse_args()
    res = Results()
    check = res.record

    with tempfile.TemporaryDirectory() as tmp:
        P = lambda *p: os.path.join(tmp, *p)  # noqa: E731
        model = P("model")
        rc, _, err = run(a.adjsh, ["init", "--out", model, "--hidden-size", "16", "--layers", "2",
                                   "--vocab-size", str(V), "--state-size", "4"])
        check("init", rc == 0, err)
        prefix = P("data", "docs")
        os.makedirs(P("data"))
        write_prepared(prefix)
        base = ["train", "--model", model, "--context", "256", "--chunk", "64", "--steps", "4"]

        rc, _, err = run(a.adjsh, base + ["--data", prefix + ".json", "--eval-every", "2",
                                          "--checkpoint-dir", P("ck")])
        check("--data trains and evaluates on the held-out split",
              rc == 0 and err.count(" val ") == 2, err)

        # Bad prepared data: exit 1, the problem named, no checkpoint.
        def bad(name, mutate, what):
            d = P(name)
            os.makedirs(d)
            pre = os.path.join(d, "docs")
            m = write_prepared(pre, vocab=V + 10 if name == "big-vocab" else V)
            mutate(pre, m)
            ck = P("ck-" + name)
            rc, _, err = run(a.adjsh, base + ["--data", pre + ".json", "--checkpoint-dir", ck])
            check(f"{name}: exit 1 naming {what!r}, no checkpoint",
                  rc == 1 and what in err and not os.path.exists(ck), f"rc={rc} {err}")

        def truncate_docs(pre, m):
            with open(pre + ".train.docs", "r+b") as f:
                f.truncate(os.path.getsize(pre + ".train.docs") - 3)

        def short_tokens(pre, m):
            with open(pre + ".train.u16", "r+b") as f:
                f.truncate(os.path.getsize(pre + ".train.u16") - 20)

        def other_format(pre, m):
            m["format"] = "something-else"
            json.dump(m, open(pre + ".json", "w"))

        def unordered(pre, m):
            with open(pre + ".train.docs", "r+b") as f:
                f.seek(8 * 3)
                f.write(struct.pack("<Q", 1))

        def manifest_field(key, value):
            def mutate(pre, m):
                m[key] = value
                json.dump(m, open(pre + ".json", "w"))
            return mutate

        bad("big-vocab", lambda pre, m: None, "more than the model's vocab_size")
        bad("negative-vocab", manifest_field("vocab_size", -3), "do not make a vocabulary")
        bad("eos-outside", manifest_field("eos_id", V), "do not make a vocabulary")
        bad("u64-dtype", manifest_field("dtype", "u64"), 'dtype "u64" is not u16 or u32')
        bad("truncated-index", truncate_docs, "not a whole number of uint64")
        bad("short-tokens", short_tokens, "the manifest says")
        bad("other-format", other_format, "format adjsh-tokens-1")
        # Fields of another JSON type: refused by name, never an abort.
        bad("format-number", manifest_field("format", 1), "format adjsh-tokens-1")
        bad("tokenizer-number", manifest_field("tokenizer", 5), "tokenizer must be a string")
        bad("unordered-index", unordered, "out of order")

        # A corpus prepared with --val-fraction 0: trained with evaluation off by default; an
        # explicit --eval-every is refused naming the missing split.
        os.makedirs(P("noval"))
        m = write_prepared(P("noval", "docs"))
        m["val"] = None
        json.dump(m, open(P("noval", "docs.json"), "w"))
        rc, _, err = run(a.adjsh, base + ["--data", P("noval", "docs.json"), "--checkpoint-dir",
                                          P("ck-noval")])
        check("--data without a held-out split: trains, evaluation off by default",
              rc == 0 and " val " not in err and "step 4/4" in err, err[-500:])
        rc, _, err = run(a.adjsh, base + ["--data", P("noval", "docs.json"), "--eval-every", "2",
                                          "--checkpoint-dir", P("ck-noval2")])
        check("--eval-every with --data without a held-out split: bad usage naming it",
              rc == 2 and "has none" in err and not os.path.exists(P("ck-noval2")), err)
        # --eval-tokens 1 would be a held-out loss of no target: refused before any step,
        # in-process and through workers.
        for extra in ([], ["--workers", "1"]):
            rc, _, err = run(a.adjsh, base + ["--data", prefix + ".json", "--eval-every", "1",
                                              "--eval-tokens", "1", "--checkpoint-dir",
                                              P("ck-ev1")] + extra)
            check(f"--eval-tokens 1 {extra}: refused before any step",
                  rc == 1 and "eval_tokens must be 0" in err and "step 1/" not in err, err[-500:])

        # A resume with a different context or batch: refused by name, the checkpoint untouched.
        before = digest(P("ck"))
        for flags, field in ((["--context", "128"], "context"), (["--batch-size", "2"],
                                                                 "batch_size")):
            args = list(base)
            if flags[0] == "--context":
                args[args.index("--context") + 1] = flags[1]
            else:
                args += flags
            rc, _, err = run(a.adjsh, args + ["--data", prefix + ".json", "--checkpoint-dir",
                                              P("ck"), "--steps", "6"])
            check(f"resume with another {field}: refused naming it, nothing changed",
                  rc == 1 and f"different {field}" in err and digest(P("ck")) == before, err)

        # --batch-size 2 through workers: bitwise the in-process weights.
        batch = base + ["--data", prefix + ".json", "--batch-size", "2", "--eval-every", "0"]
        rc, _, err = run(a.adjsh, batch + ["--checkpoint-dir", P("b-in")])
        check("--batch-size 2 in-process", rc == 0 and "x batch 2" in err, err)
        ref = digest(P("b-in")) if rc == 0 else None
        for i in range(2):
            rc, _, err = run(a.adjsh, batch + ["--checkpoint-dir", P(f"b-w{i}"), "--workers", "2"])
            check(f"--batch-size 2 through 2 workers (run {i + 1}): bitwise the in-process weights",
                  rc == 0 and digest(P(f"b-w{i}")) == ref, err[-800:])
        rc, _, err = run(a.adjsh, base + ["--data", prefix + ".json", "--eval-every", "0",
                                          "--checkpoint-dir", P("b1")])
        check("--batch-size 1 trains other weights", rc == 0 and digest(P("b1")) != ref, err)

        # The held-out loss through workers (forward-only span steps on them): bitwise the same
        # for 1, 2 and 3 workers, and the in-process one (engine/evaluate.h's chunk order) to f32
        # rounding. 700 held-out tokens in sequences of 256: two of them and one of 188, which
        # cannot have --spans 4 (3 chunks of 64) and takes its default.
        val = P("val700.u16")
        with open(val, "wb") as f:
            f.write(struct.pack("<700H", *[(i * 7 + i // 5) % V for i in range(700)]))
        ev = base + ["--data", prefix + ".json", "--val-data", val, "--eval-every", "2",
                     "--spans", "4"]

        def val_losses(ck, workers):
            log = P(ck + ".jsonl")
            extra = ["--workers", str(workers)] if workers else []
            rc, _, err = run(a.adjsh, ev + ["--checkpoint-dir", P(ck), "--log-jsonl", log] + extra)
            if rc != 0:
                return None, err
            lines = [json.loads(x) for x in open(log).read().splitlines()]
            return [(x["step"], x["val_loss"], x["val_tokens"]) for x in lines
                    if "val_loss" in x], err

        inproc, err0 = val_losses("e-in", 0)
        check("held-out loss in-process: steps 2 and 4, 700 tokens",
              inproc is not None and [(s, n) for s, _, n in inproc] == [(2, 700), (4, 700)],
              f"{inproc} {err0[-300:]}")
        through = {w: val_losses(f"e-w{w}", w) for w in (1, 2, 3)}
        first = through[1][0]
        check("held-out loss through 1, 2 and 3 workers: bitwise the same",
              first is not None and all(through[w][0] == first for w in (2, 3)),
              f"{ {w: v for w, (v, _) in through.items()} } {through[3][1][-300:]}")
        # The evaluations ran on the workers: 4 steps of 2 layers x 4 spans (28 tasks each) and
        # 2 evaluations of two 14-task sequences and one of 10 (3 spans): 112 + 76 results.
        accepted = re.search(r"(\d+) results accepted", through[2][1])
        check("the evaluations ran as tasks on the workers (at least 188 results)",
              accepted is not None and int(accepted.group(1)) >= 188, through[2][1][-300:])
        check("held-out loss through workers = in-process to f32 rounding (< 1e-5 relative)",
              first is not None and inproc is not None and len(first) == len(inproc) and
              all(abs(x[1] - y[1]) <= 1e-5 * abs(y[1]) for x, y in zip(first, inproc)),
              f"{first} vs {inproc}")

        # --doc-boundaries reset: trains, other weights than cross, the same through workers;
        # refused without a document index.
        reset = base + ["--data", prefix + ".json", "--eval-every", "0", "--doc-boundaries",
                        "reset"]
        rc, _, err = run(a.adjsh, reset + ["--checkpoint-dir", P("r-in")])
        rcw, _, errw = run(a.adjsh, reset + ["--checkpoint-dir", P("r-w"), "--workers", "2"])
        check("--doc-boundaries reset: other weights than cross, bitwise the same through workers",
              rc == 0 and rcw == 0 and digest(P("r-in")) != digest(P("b1")) and
              digest(P("r-in")) == digest(P("r-w")), err[-500:] + errw[-500:])
        # The held-out loss of a model trained with reset resets at the held-out split's
        # documents too: one sequence of 1024 tokens (dozens of short documents) evaluates to
        # `adjsh grad --doc-starts`'s loss of the final weights on it, not to the cross-document
        # `adjsh eval`; the same through 2 workers to f32 rounding. The model's mixer weights
        # are scaled up 8x so that its layers read their context (at init a reset moves the
        # loss by about 1e-6, here by about 1e-3).
        shutil.copytree(model, P("ctx_model"))
        w_path = P("ctx_model", "model.safetensors")
        header, meta, blob = st_read(w_path)
        tensors = st_tensor_bytes(header, blob)
        for name, (dt, shape, raw) in list(tensors.items()):
            if any(k in name for k in ("in_proj", "x_proj", "out_proj")):
                n = len(raw) // 4
                tensors[name] = (dt, shape, struct.pack(f"<{n}f", *[
                    8.0 * x for x in struct.unpack(f"<{n}f", raw)]))
        st_write(w_path, tensors, meta)
        os.makedirs(P("short"))
        sm = write_prepared(P("short", "docs"))
        sm["val"] = write_split(P("short", "docs"), "val",
                                [[(5 * i + 7 * j + i // 3) % (V - 1) for j in range(17 + i % 5 * 3)]
                                 for i in range(60)], V - 1)
        json.dump(sm, open(P("short", "docs.json"), "w"))
        with open(P("val1024.u16"), "wb") as f:
            f.write(open(P("short", "docs.val.u16"), "rb").read()[:2 * 1024])
        n_docs = os.path.getsize(P("short", "docs.val.docs")) // 8
        starts = struct.unpack(f"<{n_docs}Q", open(P("short", "docs.val.docs"), "rb").read())
        inside = [x for x in starts if x < 1024]
        with open(P("val1024.docs"), "wb") as f:
            f.write(struct.pack(f"<{len(inside)}Q", *inside))
        rv = ["train", "--model", P("ctx_model"), "--data", P("short", "docs.json"), "--context",
              "1024", "--chunk", "64", "--steps", "2", "--eval-every", "2", "--eval-tokens",
              "1024", "--doc-boundaries", "reset"]
        val_reset = {}
        for workers in (0, 2):
            ck, log = P(f"rv{workers}"), P(f"rv{workers}.jsonl")
            extra = ["--workers", str(workers)] if workers else []
            rc, _, err = run(a.adjsh, rv + ["--checkpoint-dir", ck, "--log-jsonl", log] + extra)
            lines = [json.loads(x) for x in open(log).read().splitlines()] if rc == 0 else []
            val_reset[workers] = (lines[-1]["val_loss"] if lines else None, err)
        step = os.path.join(P("rv0"), open(os.path.join(P("rv0"), "latest")).read().strip())
        rc1, _, gerr = run(a.adjsh, ["grad", "--model", step, "--tokens", P("val1024.u16"),
                                     "--doc-starts", P("val1024.docs"), "--chunk", "64",
                                     "--out", P("gv.st")])
        grad_loss = re.search(r"loss (\S+)", gerr)
        rc2, eout, eerr = run(a.adjsh, ["eval", "--model", step, "--tokens", P("val1024.u16"),
                                        "--context", "1024", "--chunk", "64", "--quiet"])
        cross = re.search(r"loss (\S+)", eout)
        got = val_reset[0][0]
        check("--doc-boundaries reset: documents start inside the evaluated sequence",
              len(inside) >= 10, str(inside))
        check("--doc-boundaries reset: the held-out loss resets at the held-out documents "
              "(= adjsh grad --doc-starts, != the cross-document adjsh eval)",
              got is not None and grad_loss and cross and
              abs(got - float(grad_loss.group(1))) <= 2e-6 * abs(got) + 1e-6 and
              abs(got - float(cross.group(1))) > 2e-4,
              f"{got} {grad_loss and grad_loss.group(1)} {cross and cross.group(1)} "
              f"{val_reset[0][1][-300:]} {gerr[-300:]} {eerr[-300:]}")
        check("--doc-boundaries reset: that held-out loss through 2 workers = in-process "
              "(< 1e-5 relative)",
              got is not None and val_reset[2][0] is not None and
              abs(val_reset[2][0] - got) <= 1e-5 * abs(got), f"{val_reset} ")

        rc, _, err = run(a.adjsh, ["train", "--model", model, "--tokens", prefix + ".train.u16",
                                   "--context", "256", "--steps", "1", "--doc-boundaries",
                                   "reset", "--checkpoint-dir", P("r-bad")])
        check("--doc-boundaries reset without --data: exit 1 naming doc_boundaries",
              rc == 1 and "doc_boundaries" in err and not os.path.exists(P("r-bad")), err)

        # One job definition: the same JobSpec through `adjsh train --spec` and the job API
        # (a coordinator and a worker on loopback) trains the same weights as the flags.
        spec = {"model_dir": model, "prepared_data": prefix + ".json", "context_length": 256,
                "chunk": 64, "steps": 4, "batch_size": 2, "eval_every": 2, "seed": 3,
                "checkpoint_every": 0}
        spec_path = P("job.json")
        json.dump(spec, open(spec_path, "w"))
        flags = base + ["--data", prefix + ".json", "--batch-size", "2", "--eval-every", "2",
                        "--data-seed", "3", "--checkpoint-every", "0"]
        rc1, _, err1 = run(a.adjsh, flags + ["--checkpoint-dir", P("j-flags")])
        rc2, _, err2 = run(a.adjsh, ["train", "--spec", spec_path, "--checkpoint-dir",
                                     P("x")])
        check("train --spec with a job flag: bad usage", rc2 == 2 and "--spec excludes" in err2,
              err2)
        spec["checkpoint_dir"] = P("j-spec")
        json.dump(spec, open(spec_path, "w"))
        rc2, _, err2 = run(a.adjsh, ["train", "--spec", spec_path])
        check("adjsh train --spec JOB.json = adjsh train with the same flags (bitwise)",
              rc1 == 0 and rc2 == 0 and digest(P("j-flags")) == digest(P("j-spec")),
              err1[-500:] + err2[-500:])
        cluster = Cluster(a.adjsh, tmp)
        try:
            _, addr = cluster.coordinator(P("state"))
            cluster.worker(addr, "w0")
            spec["checkpoint_dir"] = P("j-api")
            job, r = cluster.submit(addr, spec)
            w = cluster.watch(addr, job, timeout=300) if job else r
            check("the same JobSpec through adjsh submit: SUCCEEDED with the same weights",
                  job is not None and w.returncode == 0 and
                  digest(P("j-api")) == digest(P("j-flags")), r.stderr + w.stderr)
        finally:
            cluster.stop()

    return res.summary()


if __name__ == "__main__":
    sys.exit(main())
