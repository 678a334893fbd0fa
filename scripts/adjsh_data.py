#!/usr/bin/env python3
"""adjsh data preparation: turns text corpora into token files for training.

Run with the project venv (scripts/setup-venv.sh): .venv/bin/python scripts/adjsh_data.py CMD ...

Subcommands:
  prepare --tokenizer PATH --out PREFIX [options] INPUT...   tokenize a corpus into train/val files
  encode  --tokenizer PATH (--text STR | --text-file F) --out FILE.u16|FILE.u32
  decode  --tokenizer PATH --tokens FILE.u16|FILE.u32        print the decoded text

PATH is a tokenizer.json file or a model folder holding tokenizer.json. Text is always encoded
with add_special_tokens=False.

Inputs of `prepare` (files in command-line order; folders walked recursively, their files taken in
sorted path order, files of other extensions inside folders skipped and counted):
  .txt                 the whole file is one document (UTF-8)
  .jsonl, .jsonl.gz    one JSON object per line, the document is field --text-field (default
                       "text"); blank lines skipped; a null field is an empty document
  .parquet             column --text-field, read in batches; null values are empty documents
Documents that encode to no ids are skipped. Document number i (0-based over all non-empty
documents in input order) goes to the held-out split iff
  int(sha256(f"{seed}:{i}").hexdigest()[:16], 16) < val_fraction * 2**64.

Output files of `prepare` (all little-endian, written under temporary names and renamed into
place only when everything succeeded; the manifest is renamed last):
  PREFIX.train.u16 | PREFIX.train.u32   the token ids of the train split: uint16 when the
                                        tokenizer's vocabulary (with added tokens) is <= 65536,
                                        else uint32; the EOS id is placed between consecutive
                                        documents (after every document except the last)
  PREFIX.train.docs                     uint64 start offset, in tokens, of each document:
                                        strictly increasing, the first 0; a document runs to
                                        the next start minus one EOS, the last to the file end
  PREFIX.val.u16|u32, PREFIX.val.docs   the same for the held-out split (absent when
                                        --val-fraction is 0)
  PREFIX.json                           manifest: {"format": "adjsh-tokens-1", "tokenizer":
      absolute path of tokenizer.json, "tokenizer_sha256", "vocab_size", "eos_id", "dtype":
      "u16"|"u32", "text_field", "seed", "val_fraction", "inputs": [absolute paths],
      "skipped_files", "train": {"file", "docs", "tokens", "documents"}, "val": {same} | null}
The EOS id is --eos-id, else --eos-token's id, else from the tokenizer's folder: config.json
"eos_token_id", else tokenizer_config.json "eos_token", else the first of <|endoftext|>, </s>,
<eos> in the vocabulary.
"""
import argparse
import gzip
import hashlib
import json
import os
import sys
import tempfile
import time
import zlib
from array import array

FORMAT = "adjsh-tokens-1"
TEXT_BATCH_CHARS = 2 << 20       # encode documents in batches of about this much text
FLUSH_IDS = 1 << 18              # write buffered ids once this many are pending
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>")
U32_CODE = "I" if array("I").itemsize == 4 else "L"


class UserError(Exception):
    """An error reported as `adjsh CMD: error: MESSAGE` with exit status 1."""


def load_tokenizer(path):
    """Returns (Tokenizer, absolute path of its tokenizer.json) for a file or model folder."""
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise UserError(f"no tokenizer.json at {path}")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError("the tokenizers package is missing: run scripts/setup-venv.sh and use "
                        ".venv/bin/python")
    try:
        return Tokenizer.from_file(file), os.path.abspath(file)
    except Exception as e:
        raise UserError(f"cannot load tokenizer {file}: {e}")


def read_json(path):
    """Returns the JSON object in path, or {} when the file is absent, unreadable or no object."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
        return obj if isinstance(obj, dict) else {}
    except (OSError, ValueError):
        return {}


def resolve_eos(tok, tok_file, eos_id, eos_token):
    """Returns the EOS id from the options, the tokenizer's folder, or the vocabulary."""
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if eos_id is None and eos_token is not None:
        eos_id = tok.token_to_id(eos_token)
        if eos_id is None:
            raise UserError(f"--eos-token {eos_token!r} is not in the tokenizer's vocabulary")
    folder = os.path.dirname(tok_file)
    if eos_id is None:
        value = read_json(os.path.join(folder, "config.json")).get("eos_token_id")
        value = (value or [None])[0] if isinstance(value, list) else value
        eos_id = value if isinstance(value, int) else None
    if eos_id is None:
        token = read_json(os.path.join(folder, "tokenizer_config.json")).get("eos_token")
        token = token.get("content") if isinstance(token, dict) else token
        eos_id = tok.token_to_id(token) if isinstance(token, str) else None
    for token in EOS_CANDIDATES:
        eos_id = tok.token_to_id(token) if eos_id is None else eos_id
    if eos_id is None:
        raise UserError("cannot find the EOS token of this tokenizer; pass --eos-id N or "
                        "--eos-token STR")
    if not 0 <= eos_id < vocab:
        raise UserError(f"EOS id {eos_id} is outside the vocabulary (size {vocab})")
    return eos_id


def input_kind(path):
    """Returns 'txt', 'jsonl', 'jsonl.gz' or 'parquet' for a file name, else None."""
    return next((k for k in ("jsonl.gz", "jsonl", "txt", "parquet")
                 if path.lower().endswith("." + k)), None)


def collect_files(inputs):
    """Returns ([(path, kind)...], skipped count) for the INPUT arguments."""
    files, skipped = [], 0
    for inp in inputs:
        if os.path.isdir(inp):
            found = sorted(os.path.join(r, n) for r, _, names in os.walk(inp) for n in names)
            kinds = [(path, input_kind(path)) for path in found]
            files.extend((path, kind) for path, kind in kinds if kind)
            skipped += sum(1 for _, kind in kinds if kind is None)
        elif os.path.isfile(inp):
            kind = input_kind(inp)
            if kind is None:
                raise UserError(f"{inp}: unknown file type (expected .txt, .jsonl, .jsonl.gz "
                                "or .parquet)")
            files.append((inp, kind))
        else:
            raise UserError(f"{inp}: no such file or directory")
    return files, skipped


def iter_documents(path, kind, field):
    """Yields the text of each document in one input file."""
    try:
        if kind == "txt":
            with open(path, encoding="utf-8") as f:
                yield f.read()
        elif kind in ("jsonl", "jsonl.gz"):
            opener = gzip.open if kind == "jsonl.gz" else open
            with opener(path, "rt", encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except ValueError as e:
                        raise UserError(f"{path}:{lineno}: invalid JSON: {e}")
                    if not isinstance(obj, dict) or field not in obj:
                        raise UserError(f"{path}:{lineno}: no field {field!r} "
                                        "(use --text-field)")
                    text = obj[field]
                    if text is not None and not isinstance(text, str):
                        raise UserError(f"{path}:{lineno}: field {field!r} is not a string")
                    yield text or ""
        else:
            yield from iter_parquet(path, field)
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not valid UTF-8: {e}")
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(f"{path}: {e}")


def iter_parquet(path, field):
    """Yields column `field` of a parquet file, batch by batch (single-threaded reads)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: the pyarrow package is missing: run scripts/setup-venv.sh")
    try:
        with pq.ParquetFile(path) as pf:
            names = pf.schema_arrow.names
            if field not in names:
                raise UserError(f"{path}: no column {field!r} (columns: {', '.join(names)}; "
                                "use --text-field)")
            ftype = pf.schema_arrow.field(field).type
            if not (pa.types.is_string(ftype) or pa.types.is_large_string(ftype)):
                raise UserError(f"{path}: column {field!r} has type {ftype}, not string")
            for batch in pf.iter_batches(batch_size=1024, columns=[field], use_threads=False):
                for text in batch.column(0).to_pylist():
                    yield text or ""
    except pa.ArrowException as e:
        raise UserError(f"{path}: cannot read parquet: {e}")


class TempFiles:
    """Output files written under temporary names, renamed into place by commit()."""

    def __init__(self):
        self.pending = []   # (tmp path, final path)

    def open(self, final):
        """Returns a binary file object that commit() will rename to `final`."""
        d, base = os.path.split(os.path.abspath(final))
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=d)
        except OSError as e:
            raise UserError(f"cannot write {final}: {e.strerror}")
        # mkstemp's 0600 made readable as any other output is (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        self.pending.append((tmp, final))
        return os.fdopen(fd, "wb")

    def commit(self):
        """Renames every file into place, in the order they were opened."""
        while self.pending:
            os.replace(*self.pending.pop(0))

    def discard(self):
        """Removes every file not yet committed."""
        for tmp, _ in self.pending:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.pending = []


def to_bytes(values, code):
    """Returns array(code, values) as little-endian bytes."""
    a = array(code, values)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


class SplitWriter:
    """Writes one split: the token file and the document offsets."""

    def __init__(self, temps, prefix, split, dtype, eos_id):
        self.tokens_name, self.docs_name = f"{prefix}.{split}.{dtype}", f"{prefix}.{split}.docs"
        self.tok_f, self.doc_f = temps.open(self.tokens_name), temps.open(self.docs_name)
        self.code = "H" if dtype == "u16" else U32_CODE
        self.eos_id, self.tokens, self.documents = eos_id, 0, 0
        self.ids, self.starts = [], []

    def add(self, ids):
        """Appends one document (EOS first unless it is the split's first document)."""
        if self.documents:
            self.ids.append(self.eos_id)
            self.tokens += 1
        self.starts.append(self.tokens)
        self.ids.extend(ids)
        self.tokens += len(ids)
        self.documents += 1
        if len(self.ids) >= FLUSH_IDS:
            self.flush()

    def flush(self):
        """Writes the buffered ids and offsets."""
        self.tok_f.write(to_bytes(self.ids, self.code))
        self.doc_f.write(to_bytes(self.starts, "Q"))
        self.ids, self.starts = [], []

    def close(self):
        """Flushes and closes both files; returns the manifest entry of the split."""
        self.flush()
        self.tok_f.close()
        self.doc_f.close()
        return {"file": os.path.basename(self.tokens_name),
                "docs": os.path.basename(self.docs_name),
                "tokens": self.tokens, "documents": self.documents}


class Progress:
    """Progress on stderr: rewritten in place on a TTY, else one line every few seconds."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.start = self.last = time.monotonic()

    def update(self, documents, tokens, final=False):
        """Shows the counts if enough time has passed (or always when final)."""
        now = time.monotonic()
        if not final and now - self.last < (0.25 if self.tty else 5.0):
            return
        self.last = now
        rate = tokens / max(now - self.start, 1e-9)
        line = f"adjsh prepare: {documents} documents, {tokens} tokens, {rate:.0f} tokens/s"
        if self.tty:
            sys.stderr.write("\r\033[K" + line + ("\n" if final else ""))
        elif not final:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def is_val(seed, i, val_fraction):
    """The held-out rule: document i goes to val iff its hash falls below the fraction."""
    h = int(hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()[:16], 16)
    return h < val_fraction * 2 ** 64


def text_batches(files, field):
    """Yields lists of document texts of about TEXT_BATCH_CHARS characters, in input order."""
    batch, size = [], 0
    for path, kind in files:
        for text in iter_documents(path, kind, field):
            batch.append(text)
            size += len(text)
            if size >= TEXT_BATCH_CHARS:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def cmd_prepare(args, temps):
    """The prepare subcommand."""
    tok, tok_file = load_tokenizer(args.tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if args.max_vocab is not None and vocab > args.max_vocab:
        raise UserError(f"the tokenizer's vocabulary has {vocab} tokens, more than "
                        f"--max-vocab {args.max_vocab}")
    eos_id = resolve_eos(tok, tok_file, args.eos_id, args.eos_token)
    dtype = "u16" if vocab <= 65536 else "u32"
    out_dir = os.path.dirname(os.path.abspath(args.out))
    files, skipped = collect_files(args.inputs)  # bad inputs are refused before anything is made
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the output directory {out_dir}: {e.strerror}")
    with open(tok_file, "rb") as f:
        tok_sha = hashlib.sha256(f.read()).hexdigest()

    train = SplitWriter(temps, args.out, "train", dtype, eos_id)
    val = SplitWriter(temps, args.out, "val", dtype, eos_id) if args.val_fraction > 0 else None
    progress, index, tokens = Progress(), 0, 0
    for batch in text_batches(files, args.text_field):
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            ids = enc.ids
            if not ids:
                continue
            (val if val and is_val(args.seed, index, args.val_fraction) else train).add(ids)
            index += 1
            tokens += len(ids)
        progress.update(index, tokens)
    if index == 0:
        raise UserError("no documents in the inputs (all empty or none found)")
    if train.documents == 0:
        raise UserError("the train split is empty (lower --val-fraction or add documents)")
    if val is not None and val.documents == 0:
        raise UserError("the held-out split is empty (raise --val-fraction or add documents)")

    manifest = {
        "format": FORMAT, "tokenizer": tok_file, "tokenizer_sha256": tok_sha,
        "vocab_size": vocab, "eos_id": eos_id, "dtype": dtype, "text_field": args.text_field,
        "seed": args.seed, "val_fraction": args.val_fraction,
        "inputs": [os.path.abspath(p) for p in args.inputs], "skipped_files": skipped,
        "train": train.close(), "val": val.close() if val else None,
    }
    with temps.open(args.out + ".json") as f:
        f.write((json.dumps(manifest, indent=2) + "\n").encode())
    temps.commit()
    # Remove stale outputs of an earlier run with another dtype or with a val split.
    keep = {w.tokens_name for w in (train, val) if w} | {w.docs_name for w in (train, val) if w}
    for name in (f"{args.out}.{split}.{ext}" for split in ("train", "val")
                 for ext in ("u16", "u32", "docs")):
        if name not in keep and os.path.exists(name):
            os.unlink(name)

    progress.update(index, tokens, final=True)
    secs = time.monotonic() - progress.start
    v = manifest["val"] or {"documents": 0, "tokens": 0}
    print(f"adjsh prepare: {index} documents: train {train.documents} documents / "
          f"{train.tokens} tokens, val {v['documents']} documents / {v['tokens']} tokens; "
          f"{skipped} skipped files; {secs:.1f} s, {tokens / max(secs, 1e-9):.0f} tokens/s",
          file=sys.stderr)


def token_dtype(path):
    """Returns the array code for a .u16 / .u32 token file name."""
    code = {".u16": "H", ".u32": U32_CODE}.get(os.path.splitext(path)[1])
    if code is None:
        raise UserError(f"{path}: a token file must end in .u16 or .u32")
    return code


def cmd_encode(args, temps):
    """The encode subcommand."""
    code = token_dtype(args.out)
    tok, _ = load_tokenizer(args.tokenizer)
    text = args.text
    if text is None:
        try:
            with open(args.text_file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{args.text_file}: {e}")
    ids = tok.encode(text, add_special_tokens=False).ids
    if code == "H" and ids and max(ids) > 0xFFFF:
        raise UserError(f"id {max(ids)} does not fit in {args.out} (use .u32)")
    with temps.open(args.out) as f:
        f.write(to_bytes(ids, code))
    temps.commit()
    print(len(ids), file=sys.stderr)


def cmd_decode(args, temps):
    """The decode subcommand."""
    code = token_dtype(args.tokens)
    tok, _ = load_tokenizer(args.tokenizer)
    try:
        with open(args.tokens, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"{args.tokens}: {e}")
    a = array(code)
    if len(data) % a.itemsize:
        raise UserError(f"{args.tokens}: size {len(data)} is not a multiple of {a.itemsize}")
    a.frombytes(data)
    if sys.byteorder == "big":
        a.byteswap()
    ids = a.tolist()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    for i, v in enumerate(ids):  # the tokenizer would drop it without a word
        if v >= vocab:
            raise UserError(f"{args.tokens}: id {v} at position {i} is not in the tokenizer's "
                            f"vocabulary of {vocab}")
    print(tok.decode(ids, skip_special_tokens=False))


def fraction(s):
    """argparse type: a float in [0, 1]."""
    v = float(s)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {s}")
    return v


def build_parser():
    """The argument parser with its three subcommands."""
    p = argparse.ArgumentParser(prog="adjsh_data.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True, metavar="CMD")
    tok_help = "tokenizer.json, or a model folder holding tokenizer.json"
    pp = sub.add_parser("prepare", help="tokenize a corpus into train/val token files",
                        description="Tokenize INPUT files/folders (.txt, .jsonl, .jsonl.gz, "
                        ".parquet) into PREFIX.{train,val}.{u16|u32,docs} and PREFIX.json.")
    pp.add_argument("--tokenizer", required=True, metavar="PATH", help=tok_help)
    pp.add_argument("--out", required=True, metavar="PREFIX", help="output path prefix")
    pp.add_argument("--text-field", default="text", metavar="NAME",
                    help="JSON field / parquet column of the text (default: text)")
    pp.add_argument("--val-fraction", type=fraction, default=0.01, metavar="F",
                    help="fraction of documents held out (default 0.01; 0: no val split)")
    pp.add_argument("--seed", type=int, default=0, metavar="S",
                    help="seed of the held-out split (default 0)")
    eos = pp.add_mutually_exclusive_group()
    eos.add_argument("--eos-id", type=int, metavar="N", help="EOS id placed between documents")
    eos.add_argument("--eos-token", metavar="STR", help="EOS token, looked up in the vocabulary")
    pp.add_argument("--max-vocab", type=int, metavar="V",
                    help="fail if the tokenizer's vocabulary is larger than V")
    pp.add_argument("inputs", nargs="+", metavar="INPUT", help="input files or folders")
    pe = sub.add_parser("encode", help="encode a text into a token file",
                        description="Write the ids of a text (no special tokens added) to a "
                        ".u16 or .u32 file; prints the number of ids on stderr.")
    pe.add_argument("--tokenizer", required=True, metavar="PATH", help=tok_help)
    src = pe.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", metavar="STR", help="the text")
    src.add_argument("--text-file", metavar="FILE", help="a UTF-8 file holding the text")
    pe.add_argument("--out", required=True, metavar="FILE", help="FILE.u16 or FILE.u32")
    pd = sub.add_parser("decode", help="print the text of a token file",
                        description="Print the decoded text of a .u16 or .u32 token file.")
    pd.add_argument("--tokenizer", required=True, metavar="PATH", help=tok_help)
    pd.add_argument("--tokens", required=True, metavar="FILE", help="FILE.u16 or FILE.u32")
    for parser, func in ((pp, cmd_prepare), (pe, cmd_encode), (pd, cmd_decode)):
        parser.set_defaults(func=func)
    return p


def main(argv=None):
    """Parses the command line and runs the subcommand; returns the exit status."""
    args = build_parser().parse_args(argv)
    temps = TempFiles()
    try:
        args.func(args, temps)
        return 0
    except UserError as e:
        if sys.stderr.isatty():
            sys.stderr.write("\r\033[K")
        print(f"adjsh {args.cmd}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        temps.discard()


if __name__ == "__main__":
    sys.exit(main())
