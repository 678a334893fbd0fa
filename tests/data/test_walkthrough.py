#!/usr/bin/env python3
"""Runs the README's fine-tuning walkthrough (the shell block between the `walkthrough` markers)
as written, on a model folder and a corpus made here (nothing is downloaded):
  * $MODEL: a Mamba model folder made by `adjsh init`, with a byte-level BPE tokenizer.json
    trained here on local text (the tokenizer's vocabulary is the model's);
  * $DOCS: a .jsonl.gz of documents (the license texts, cut into paragraphs).
Then checks what the walkthrough promises: the prepared manifest and splits, a step log with
held-out losses that fall, an eval result line, generated text. Run with the project venv
(scripts/setup-venv.sh):
  .venv/bin/python tests/data/test_walkthrough.py --adjsh build/cli/adjsh
Prints PASS/FAIL per check and `N passed, N failed`; exits 1 on any failure.
"""
import argparse
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:  # pragma: no cover
    sys.exit(f"test_walkthrough: needs tokenizers ({e}): run scripts/setup-venv.sh")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import Results  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def walkthrough_block():
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- walkthrough:begin -->\s*```sh\n(.*?)```\s*<!-- walkthrough:end -->",
                  text, re.S)
    if not m:
        sys.exit("README.md has no walkthrough block")
    return m.group(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    a = ap.parse_args()
    res = Results()
    check = res.record

    adjsh = os.path.abspath(a.adjsh)
    with tempfile.TemporaryDirectory() as tmp:
        texts = [open(p, errors="replace").read() for p in sorted(glob.glob(
            "/usr/share/common-licenses/*")) if os.path.isfile(p)]
        docs = [d.strip() for t in texts for d in t.split("\n\n") if len(d.strip()) > 200]
        docs_path = os.path.join(tmp, "docs.jsonl.gz")
        with gzip.open(docs_path, "wt", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(docs, trainers.BpeTrainer(
            vocab_size=512, special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        model = os.path.join(tmp, "model")
        r = subprocess.run([adjsh, "init", "--out", model, "--hidden-size", "32", "--layers", "2",
                            "--vocab-size", str(tok.get_vocab_size())], capture_output=True,
                           text=True)
        check("adjsh init the model folder", r.returncode == 0, r.stderr)
        tok.save(os.path.join(model, "tokenizer.json"))

        bin_dir = os.path.join(tmp, "bin")
        os.makedirs(bin_dir)
        os.symlink(adjsh, os.path.join(bin_dir, "adjsh"))
        env = dict(os.environ, MODEL=model, DOCS=docs_path,
                   PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        work = os.path.join(tmp, "work")
        os.makedirs(work)
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", walkthrough_block()], cwd=work,
                           env=env, capture_output=True, text=True, timeout=900)
        check("the walkthrough runs as written", r.returncode == 0,
              f"rc={r.returncode}\nstdout: {r.stdout[-1500:]}\nstderr: {r.stderr[-2500:]}")
        manifest = os.path.join(work, "data", "docs.json")
        if os.path.exists(manifest):
            m = json.load(open(manifest))
            check(f"prepared: {m['train']['documents']} train and {m['val']['documents']} "
                  f"held-out documents, {m['train']['tokens']} train tokens",
                  m["train"]["documents"] > 0 and m["val"]["documents"] > 0 and
                  m["vocab_size"] == tok.get_vocab_size(), m)
        log = os.path.join(work, "data", "train.jsonl")
        vals = [json.loads(x).get("val_loss") for x in open(log)] if os.path.exists(log) else []
        vals = [v for v in vals if v is not None]
        check(f"held-out losses in the step log fall ({vals[:1]} -> {vals[-1:]})",
              len(vals) >= 2 and vals[-1] < vals[0], vals)
        check("eval printed 'loss L ppl P tokens N'",
              re.search(r"^loss \S+ ppl \S+ tokens \d+$", r.stdout, re.M) is not None, r.stdout)
        lines = [x for x in r.stdout.splitlines() if x and not x.startswith("loss ")]
        check("generate printed text", len("".join(lines)) > 20, r.stdout)

    return res.summary()


if __name__ == "__main__":
    sys.exit(main())
