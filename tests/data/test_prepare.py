#!/usr/bin/env python3
"""Tests of scripts/adjsh_data.py (prepare / encode / decode).

Run with the project venv (scripts/setup-venv.sh makes it):
  .venv/bin/python tests/data/test_prepare.py --script scripts/adjsh_data.py
Prints `PASS name` or `FAIL name: detail` per case and `N passed, N failed` last; exits 1 when a
case failed. Everything happens in a temporary directory; the tokenizers are trained or built
here from local text, nothing is downloaded.
"""
import argparse
import glob
import gzip
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback
from array import array

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:
    print(f"test_prepare: {e}: run scripts/setup-venv.sh and use .venv/bin/python", file=sys.stderr)
    sys.exit(1)

SCRIPT = None   # path of adjsh_data.py, from --script
TMP = None      # the test's temporary directory
CASES = []

TXT_A = "The quick brown fox jumps over the lazy dog.\nSecond line of a.txt.\n"
TXT_B = "Permission is hereby granted, free of charge, to any person.\n"
TXT_C = "deeply nested\tfile with tabs\tand  spaces  "
JSONL_DOCS = ["héllo wörld — naïve café", "日本語のテキスト 🙂 emoji", "", "Ελληνικά και русский",
              "plain ascii line"]
PARQUET_DOCS = [f"parquet row {i}: GNU General Public License clause {i * 7}" for i in range(40)]


def case(fn):
    """Registers a test case."""
    CASES.append(fn)
    return fn


def run(*args):
    """Runs the script with args; returns the CompletedProcess (text output)."""
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          encoding="utf-8")


def check(cond, detail):
    """Fails the current case with detail unless cond."""
    if not cond:
        raise AssertionError(detail)


def fresh_dir(name):
    """Returns a new empty directory under TMP."""
    d = os.path.join(TMP, name)
    os.makedirs(d)
    return d


def read_ints(path, code):
    """Returns the little-endian integers of a file as a list."""
    a = array(code)
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder == "big":
        a.byteswap()
    return a.tolist()


U32 = "I" if array("I").itemsize == 4 else "L"


def write(path, text):
    """Writes a UTF-8 text file, making its folder."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def setup():
    """Builds the tokenizers and the input corpus used by the cases; returns a dict of paths."""
    env = {}
    # A small byte-level BPE tokenizer trained on the local license texts.
    files = sorted(f for f in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(f))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train(files, trainer)
    env["model"] = fresh_dir("model")
    tok.save(os.path.join(env["model"], "tokenizer.json"))
    env["tok"] = tok

    # A WordLevel tokenizer with 70000 entries (> 65536): u32 output; EOS found as "</s>".
    vocab = {f"w{i}": i for i in range(70000)}
    vocab.update({"[UNK]": 70000, "</s>": 70001})
    big = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    big.pre_tokenizer = pre_tokenizers.Whitespace()
    env["big_model"] = fresh_dir("big_model")
    big.save(os.path.join(env["big_model"], "tokenizer.json"))
    env["big"] = big

    # The corpus: a folder (with an empty file, a skipped file and nested folders), a
    # .jsonl.gz with field "body" and a parquet file with column "body".
    corpus = os.path.join(TMP, "corpus")
    write(os.path.join(corpus, "a.txt"), TXT_A)
    write(os.path.join(corpus, "empty.txt"), "")
    write(os.path.join(corpus, "README.md"), "not an input")
    write(os.path.join(corpus, "sub", "b.txt"), TXT_B)
    write(os.path.join(corpus, "sub", "deeper", "c.txt"), TXT_C)
    env["corpus"] = corpus
    env["jsonl"] = os.path.join(TMP, "extra.jsonl.gz")
    with gzip.open(env["jsonl"], "wt", encoding="utf-8") as f:
        for i, d in enumerate(JSONL_DOCS):
            f.write(json.dumps({"id": i, "body": d}, ensure_ascii=(i % 2 == 0)) + "\n")
            if i == 1:
                f.write("\n   \n")
    env["parquet"] = os.path.join(TMP, "data.parquet")
    pq.write_table(pa.table({"id": list(range(len(PARQUET_DOCS))), "body": PARQUET_DOCS}),
                   env["parquet"], row_group_size=16)
    # Expected documents, in order, empty ones excluded (README.md is skipped, sorted order).
    env["docs"] = [TXT_A, TXT_B, TXT_C] + [d for d in JSONL_DOCS if d] + PARQUET_DOCS
    return env


def split_expected(docs, tok, seed, fraction, eos):
    """Returns {split: (ids, offsets, n docs)} per the sha256 rule."""
    out = {"train": ([], [], 0), "val": ([], [], 0)}
    for i, d in enumerate(docs):
        h = int(hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()[:16], 16)
        split = "val" if h < fraction * 2 ** 64 else "train"
        ids, offs, n = out[split]
        if n:
            ids.append(eos)
        offs.append(len(ids))
        ids.extend(tok.encode(d, add_special_tokens=False).ids)
        out[split] = (ids, offs, n + 1)
    return out


def prepare(env, out_dir, *extra, inputs=None):
    """Runs prepare over the standard corpus into out_dir/corpus; returns (proc, prefix)."""
    prefix = os.path.join(out_dir, "corpus")
    inputs = inputs or [env["corpus"], env["jsonl"], env["parquet"]]
    p = run("prepare", "--tokenizer", env["model"], "--out", prefix, "--text-field", "body",
            "--val-fraction", "0.3", "--seed", "7", *extra, *inputs)
    return p, prefix


def check_outputs(env, prefix, eos, tok=None, docs=None, code="H", dtype="u16", seed=7,
                  fraction=0.3):
    """Checks the token files, offsets and manifest of a prepare run against the rule."""
    tok, docs = tok or env["tok"], docs or env["docs"]
    exp = split_expected(docs, tok, seed, fraction, eos)
    with open(prefix + ".json", encoding="utf-8") as f:
        m = json.load(f)
    check(m["format"] == "adjsh-tokens-1" and m["dtype"] == dtype, f"manifest: {m}")
    check(m["eos_id"] == eos, f"eos_id {m['eos_id']} != {eos}")
    check(m["vocab_size"] == tok.get_vocab_size(with_added_tokens=True), "vocab_size")
    check(m["seed"] == seed and m["val_fraction"] == fraction, "seed/val_fraction")
    with open(m["tokenizer"], "rb") as f:
        check(m["tokenizer_sha256"] == hashlib.sha256(f.read()).hexdigest(), "tokenizer_sha256")
    check(os.path.isabs(m["tokenizer"]) and all(os.path.isabs(p) for p in m["inputs"]),
          "paths not absolute")
    total = 0
    for split in ("train", "val"):
        ids, offs, n = exp[split]
        if fraction == 0 and split == "val":
            check(m["val"] is None, "val should be null")
            check(not os.path.exists(f"{prefix}.val.{dtype}"), "val file written")
            continue
        check(n > 0, f"test corpus gives an empty {split} split")
        e = m[split]
        check(e == {"file": os.path.basename(f"{prefix}.{split}.{dtype}"),
                    "docs": os.path.basename(f"{prefix}.{split}.docs"),
                    "tokens": len(ids), "documents": n}, f"manifest {split}: {e}")
        got = read_ints(f"{prefix}.{split}.{dtype}", code)
        check(got == ids, f"{split} ids differ (got {len(got)}, want {len(ids)})")
        got_offs = read_ints(f"{prefix}.{split}.docs", "Q")
        check(got_offs == offs, f"{split} offsets {got_offs[:5]}... != {offs[:5]}...")
        check(got_offs[0] == 0 and all(a < b for a, b in zip(got_offs, got_offs[1:])),
              "offsets not strictly increasing from 0")
        total += n
    check(total == len(docs), f"{total} documents in the splits, {len(docs)} expected")
    return m


@case
def prepare_mixed_inputs(env):
    """txt folder + jsonl.gz + parquet; EOS resolved from the vocab; u16."""
    out = fresh_dir("out_mixed")
    p, prefix = prepare(env, out)
    check(p.returncode == 0, f"rc {p.returncode}: {p.stderr}")
    eos = env["tok"].token_to_id("<|endoftext|>")
    m = check_outputs(env, prefix, eos)
    check(m["skipped_files"] == 1 and m["text_field"] == "body", f"manifest: {m}")
    want = sorted(["corpus.json", "corpus.train.u16", "corpus.train.docs", "corpus.val.u16",
                   "corpus.val.docs"])
    check(sorted(os.listdir(out)) == want, f"files: {sorted(os.listdir(out))}")
    check("skipped" in p.stderr and "tokens/s" in p.stderr, f"no summary: {p.stderr!r}")
    env["mixed_out"] = out


@case
def prepare_eos_token_option(env):
    """--eos-token <|endoftext|> gives the same files as the default resolution."""
    p, prefix = prepare(env, fresh_dir("out_eos_token"), "--eos-token", "<|endoftext|>")
    check(p.returncode == 0, f"rc {p.returncode}: {p.stderr}")
    check_outputs(env, prefix, env["tok"].token_to_id("<|endoftext|>"))
    for name in os.listdir(env["mixed_out"]):
        with open(os.path.join(env["mixed_out"], name), "rb") as a, \
                open(os.path.join(os.path.dirname(prefix), name), "rb") as b:
            check(a.read() == b.read(), f"{name} differs from the default run")


@case
def prepare_eos_id_and_folder_configs(env):
    """--eos-id N, config.json eos_token_id and tokenizer_config.json eos_token are used."""
    p, prefix = prepare(env, fresh_dir("out_eos_id"), "--eos-id", "5")
    check(p.returncode == 0, f"rc {p.returncode}: {p.stderr}")
    check_outputs(env, prefix, 5)
    model = fresh_dir("model_cfg")
    shutil.copy(os.path.join(env["model"], "tokenizer.json"), model)
    write(os.path.join(model, "tokenizer_config.json"), json.dumps({"eos_token": {"content": "a"}}))
    prefix = os.path.join(fresh_dir("out_tok_cfg"), "corpus")
    p = run("prepare", "--tokenizer", model, "--out", prefix, "--val-fraction", "0", TMP + "/corpus")
    check(p.returncode == 0, f"rc {p.returncode}: {p.stderr}")
    check(json.load(open(prefix + ".json"))["eos_id"] == env["tok"].token_to_id("a"), "eos a")
    write(os.path.join(model, "config.json"), json.dumps({"eos_token_id": 3}))
    p = run("prepare", "--tokenizer", os.path.join(model, "tokenizer.json"), "--out", prefix,
            "--val-fraction", "0", TMP + "/corpus")
    check(p.returncode == 0, f"rc {p.returncode}: {p.stderr}")
    check(json.load(open(prefix + ".json"))["eos_id"] == 3, "config.json eos_token_id not used")


@case
def prepare_deterministic(env):
    """Two runs give byte-identical outputs."""
    outs = []
    for name in ("out_det1", "out_det2"):
        p, _ = prepare(env, fresh_dir(name))
        check(p.returncode == 0, f"rc {p.returncode}: {p.stderr}")
        outs.append(os.path.join(TMP, name))
    names = sorted(os.listdir(outs[0]))
    check(names == sorted(os.listdir(outs[1])) and len(names) == 5, f"files: {names}")
    for name in names:
        with open(os.path.join(outs[0], name), "rb") as a, \
                open(os.path.join(outs[1], name), "rb") as b:
            check(a.read() == b.read(), f"{name} differs between runs")


@case
def prepare_no_val_split(env):
    """--val-fraction 0 writes no val files and a null val entry."""
    out = fresh_dir("out_noval")
    p, prefix = prepare(env, out, "--val-fraction", "0")
    check(p.returncode == 0, f"rc {p.returncode}: {p.stderr}")
    check_outputs(env, prefix, env["tok"].token_to_id("<|endoftext|>"), fraction=0.0)
    check(sorted(os.listdir(out)) == ["corpus.json", "corpus.train.docs", "corpus.train.u16"],
          f"files: {os.listdir(out)}")


@case
def prepare_large_vocab_u32(env):
    """A 70002-entry vocabulary writes .u32 files with the right ids."""
    docs = ["w1 w69999 w65536 w0", "w65535 w70000x w42", "w123 w4567 w69998"]
    inp = fresh_dir("in_big")
    for i, d in enumerate(docs):
        write(os.path.join(inp, f"{i}.txt"), d)
    out = fresh_dir("out_big")
    prefix = os.path.join(out, "big")
    p = run("prepare", "--tokenizer", env["big_model"], "--out", prefix, "--val-fraction", "0",
            inp)
    check(p.returncode == 0, f"rc {p.returncode}: {p.stderr}")
    m = check_outputs(env, prefix, 70001, tok=env["big"], docs=docs, code=U32, dtype="u32",
                      seed=0, fraction=0.0)
    check(m["vocab_size"] == 70002, f"vocab_size {m['vocab_size']}")
    ids = read_ints(prefix + ".train.u32", U32)
    check(ids[:4] == [1, 69999, 65536, 0] and 70000 in ids, f"ids {ids}")


@case
def prepare_max_vocab(env):
    """--max-vocab smaller than the tokenizer: exit 1 naming both sizes, nothing written."""
    out = fresh_dir("out_maxvocab")
    p, _ = prepare(env, out, "--max-vocab", "100")
    size = env["tok"].get_vocab_size(with_added_tokens=True)
    check(p.returncode == 1, f"rc {p.returncode}")
    check(str(size) in p.stderr and "100" in p.stderr, f"message: {p.stderr!r}")
    check(os.listdir(out) == [], f"left behind: {os.listdir(out)}")
    p, _ = prepare(env, fresh_dir("out_maxvocab_ok"), "--max-vocab", str(size))
    check(p.returncode == 0, f"--max-vocab {size}: rc {p.returncode}: {p.stderr}")


def expect_error(env, name, inputs, words, *extra):
    """Runs prepare on inputs; checks exit 1, `error:` naming words, and an empty out dir."""
    out = fresh_dir(name)
    p, _ = prepare(env, out, *extra, inputs=inputs)
    check(p.returncode == 1, f"rc {p.returncode}: {p.stderr}")
    check("adjsh prepare: error:" in p.stderr, f"message: {p.stderr!r}")
    for w in words:
        check(w in p.stderr, f"{w!r} not in message {p.stderr!r}")
    check(os.listdir(out) == [], f"left behind: {os.listdir(out)}")


@case
def error_no_documents(env):
    """Only empty files: exit 1, nothing written."""
    d = fresh_dir("in_empty")
    write(os.path.join(d, "x.txt"), "")
    write(os.path.join(d, "y", "z.txt"), "")
    expect_error(env, "out_nodocs", [d], ["no documents"])


@case
def error_bad_json_line(env):
    """A bad JSON line: exit 1 naming the file and the line."""
    path = os.path.join(fresh_dir("in_badjson"), "bad.jsonl")
    write(path, '{"body": "ok"}\n\n{"body": "unterminated\n{"body": "x"}\n')
    expect_error(env, "out_badjson", [path], [f"{path}:3", "JSON"])


@case
def error_missing_text_field(env):
    """A line without the text field: exit 1 naming file, line and field."""
    path = os.path.join(fresh_dir("in_nofield"), "nofield.jsonl")
    write(path, '{"body": "ok"}\n{"text": "wrong field"}\n')
    expect_error(env, "out_nofield", [path], [f"{path}:2", "'body'"])


@case
def error_parquet_without_column(env):
    """A parquet file without the column: exit 1 naming it."""
    path = os.path.join(fresh_dir("in_pqcol"), "other.parquet")
    pq.write_table(pa.table({"content": ["a", "b"]}), path)
    expect_error(env, "out_pqcol", [path], [path, "'body'"])


@case
def error_unknown_extension(env):
    """An explicit file with an unknown extension: exit 1 naming it."""
    path = os.path.join(fresh_dir("in_csv"), "data.csv")
    write(path, "a,b\n")
    expect_error(env, "out_csv", [env["corpus"], path], [path])


@case
def error_missing_input(env):
    """A missing input: exit 1 naming it."""
    path = os.path.join(TMP, "does-not-exist.txt")
    expect_error(env, "out_missing", [path], [path])


@case
def error_empty_heldout(env):
    """One document that the rule puts in train with a tiny fraction: empty held-out split."""
    d = fresh_dir("in_one")
    write(os.path.join(d, "one.txt"), "a single document")
    expect_error(env, "out_emptyval", [d], ["held-out split is empty"], "--val-fraction",
                 "0.0001")


@case
def encode_decode_roundtrip(env):
    """encode then decode gives the text back; encode prints the number of ids."""
    text = "Round trip: naïve café — 日本語 🙂\nsecond line\t<|endoftext|> end"
    out = os.path.join(fresh_dir("out_encode"), "t.u16")
    p = run("encode", "--tokenizer", env["model"], "--text", text, "--out", out)
    check(p.returncode == 0, f"encode rc {p.returncode}: {p.stderr}")
    ids = env["tok"].encode(text, add_special_tokens=False).ids
    check(read_ints(out, "H") == ids, "encoded ids differ")
    check(p.stderr.strip() == str(len(ids)), f"stderr {p.stderr!r}, {len(ids)} ids")
    p = run("decode", "--tokenizer", env["model"], "--tokens", out)
    check(p.returncode == 0 and p.stdout == text + "\n", f"decode gave {p.stdout!r}")
    src = os.path.join(TMP, "out_encode", "src.txt")
    write(src, text)
    out32 = os.path.join(TMP, "out_encode", "t.u32")
    p = run("encode", "--tokenizer", env["model"], "--text-file", src, "--out", out32)
    check(p.returncode == 0 and read_ints(out32, U32) == ids, f"u32 encode: {p.stderr}")
    p = run("decode", "--tokenizer", env["model"], "--tokens", out32)
    check(p.stdout == text + "\n", f"u32 decode gave {p.stdout!r}")


@case
def encode_decode_errors(env):
    """encode into a missing folder and decode of an id past the vocabulary: exit 1 with one
    line naming the problem (no traceback); outputs are readable as any file (0666 - umask)."""
    missing = os.path.join(TMP, "no-such-folder", "t.u32")
    p = run("encode", "--tokenizer", env["model"], "--text", "hi", "--out", missing)
    check(p.returncode == 1 and "no-such-folder" in p.stderr and "Traceback" not in p.stderr,
          f"encode into a missing folder: rc {p.returncode}: {p.stderr}")
    vocab = env["tok"].get_vocab_size(with_added_tokens=True)
    bad = os.path.join(fresh_dir("out_badid"), "bad.u32")
    with open(bad, "wb") as f:
        f.write(struct.pack("<3I", 1, vocab, 2))
    p = run("decode", "--tokenizer", env["model"], "--tokens", bad)
    check(p.returncode == 1 and f"id {vocab} at position 1" in p.stderr and p.stdout == "",
          f"decode of id {vocab}: rc {p.returncode}, stdout {p.stdout!r}: {p.stderr}")
    out = os.path.join(TMP, "out_badid", "ok.u16")
    umask = os.umask(0o022)
    try:
        p = run("encode", "--tokenizer", env["model"], "--text", "hi", "--out", out)
    finally:
        os.umask(umask)
    mode = os.stat(out).st_mode & 0o777
    check(p.returncode == 0 and mode == 0o644, f"encode output mode {oct(mode)}: {p.stderr}")


@case
def help_and_usage(env):
    """--help of the program and of each subcommand exits 0; bad usage exits 2."""
    for args in ([], ["prepare"], ["encode"], ["decode"]):
        p = run(*args, "--help")
        check(p.returncode == 0 and "usage:" in p.stdout, f"{args} --help: rc {p.returncode}")
    p = run("prepare", "--out", "x", env["corpus"])
    check(p.returncode == 2, f"missing --tokenizer: rc {p.returncode}")
    p = run("prepare", "--tokenizer", env["model"], "--out", "x", "--val-fraction", "2", "a")
    check(p.returncode == 2, f"--val-fraction 2: rc {p.returncode}")


def main():
    """Runs every case; returns the exit status."""
    global SCRIPT, TMP
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", required=True, help="path of scripts/adjsh_data.py")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    SCRIPT = os.path.abspath(args.script)
    TMP = tempfile.mkdtemp(prefix="adjsh-test-prepare-")
    passed = failed = 0
    try:
        env = setup()
        for fn in CASES:
            try:
                fn(env)
                print(f"PASS {fn.__name__}")
                passed += 1
            except AssertionError as e:
                print(f"FAIL {fn.__name__}: {e}")
                failed += 1
            except Exception:
                detail = traceback.format_exc().strip().splitlines()[-1]
                print(f"FAIL {fn.__name__}: {detail}")
                failed += 1
            sys.stdout.flush()
    finally:
        if args.keep:
            print(f"kept {TMP}", file=sys.stderr)
        else:
            shutil.rmtree(TMP, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
