#!/usr/bin/env python3
"""The bits do not move: gradients and 5-step checkpoints of both model types, byte for byte.

A fixed set of small runs (in-process, 3 workers with the tree and the star reduction, f32 and
f64, bf16 storage, a truncated window, the wavefront, held-out evaluation, decoding; Mamba-1 and
Mamba-2) whose outputs are
hashed tensor by tensor (name, dtype, shape and bytes of each safetensors entry, so a header's
metadata may change without moving anything). tests/bits/fixtures.json holds the digests
recorded before a refactor, keyed by the machine: OpenBLAS picks its GEMM kernels by CPU, so the
same build gives other bits on another CPU model (docs/USAGE.md, "bitwise equality holds among workers
of one kind"). On a machine with no entry the test says so and exits 77 (CTest's skip);
`--record` adds this machine's entry, to be done only from a commit whose bits are the
reference.

  bits_fixtures.py --adjsh build/cli/adjsh [--record] [--only NAME ...]
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures.json")
CORPUS = "/usr/share/common-licenses/GPL-3"
SKIP = 77


def machine_key():
    """What decides the bits of a CPU build: the CPU model, its vector ISA, OpenBLAS's core."""
    model, flags = "unknown", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "base"
    core = os.environ.get("OPENBLAS_CORETYPE", "-")
    return f"{model} | {isa} | openblas {core}"


def tensor_digest(path):
    """sha256 over (name, dtype, shape, bytes) of every tensor, in name order."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    h = hashlib.sha256()
    for name in sorted(k for k in header if k != "__metadata__"):
        e = header[name]
        a, b = e["data_offsets"]
        h.update(f"{name}|{e['dtype']}|{e['shape']}|".encode())
        h.update(data[a:b])
    return h.hexdigest()


class Runner:
    def __init__(self, adjsh, tmp):
        self.adjsh, self.tmp = adjsh, tmp

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def run(self, args, timeout=600):
        p = subprocess.run([self.adjsh] + args, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"adjsh {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
        return p

    def setup(self):
        self.run(["tokenize", "--text", CORPUS, "--out", self.path("tok.u16"), "--length", "3000"])
        self.run(["init", "--out", self.path("m1"), "--hidden-size", "32", "--layers", "3",
                  "--vocab-size", "256", "--seed", "7"])
        self.run(["init", "--out", self.path("m2"), "--model-type", "mamba2", "--hidden-size", "32",
                  "--layers", "2", "--vocab-size", "256", "--head-dim", "16", "--groups", "1",
                  "--seed", "7"])

    def grad(self, name, model, flags):
        out = self.path(name + ".safetensors")
        self.run(["grad", "--model", self.path(model), "--tokens", self.path("tok.u16"),
                  "--out", out, "--chunk", "64", "--spans", "5", "--threads", "2", "--quiet"]
                 + flags)
        return {name: tensor_digest(out)}

    def evaluate(self, name, model, flags):
        """Held-out losses (the evaluator's, in-process or through workers) as a training run
        logs them (shortest round-trip decimals, so every bit), and the steps' losses."""
        log = self.path(name + ".jsonl")
        self.run(["train", "--model", self.path(model), "--tokens", self.path("tok.u16"),
                  "--context", "1000", "--steps", "2", "--chunk", "64", "--spans", "4",
                  "--val-data", self.path("tok.u16"), "--eval-every", "1", "--eval-tokens", "2000",
                  "--log-jsonl", log, "--checkpoint-dir", self.path(name), "--threads", "2"]
                 + flags)
        with open(log) as f:
            rows = [json.loads(line) for line in f]
        values = [[r["loss"], r["val_loss"]] for r in rows]
        return {name: hashlib.sha256(repr(values).encode()).hexdigest()}

    def generate(self, name, model, flags):
        """Sampled ids after a prompt: decoding through the model's stream."""
        prompt, out = self.path("prompt.u16"), self.path(name + ".u32")
        with open(self.path("tok.u16"), "rb") as f, open(prompt, "wb") as g:
            g.write(f.read(100))
        self.run(["generate", "--model", self.path(model), "--prompt-tokens", prompt,
                  "--max-new-tokens", "24", "--temperature", "0.8", "--top-k", "20", "--seed", "3",
                  "--out", out] + flags)
        with open(out, "rb") as f:
            return {name: hashlib.sha256(f.read()).hexdigest()}

    def train(self, name, model, flags):
        ckpt = self.path(name)
        self.run(["train", "--model", self.path(model), "--tokens", self.path("tok.u16"),
                  "--context", "1024", "--steps", "5", "--chunk", "64", "--spans", "4",
                  "--checkpoint-dir", ckpt, "--checkpoint-every", "0", "--threads", "2"] + flags)
        with open(os.path.join(ckpt, "latest")) as f:
            last = os.path.join(ckpt, f.read().strip())
        return {name + "/model": tensor_digest(os.path.join(last, "model.safetensors")),
                name + "/optimizer": tensor_digest(os.path.join(last, "optimizer.safetensors"))}


W3 = ["--workers", "3"]
CASES = [
    # Mamba-1 gradients.
    ("m1_grad_f32", "grad", "m1", []),
    ("m1_grad_f64", "grad", "m1", ["--dtype", "f64"]),
    ("m1_grad_bf16", "grad", "m1", ["--storage", "bf16"]),
    ("m1_grad_window", "grad", "m1", ["--window", "500"]),
    ("m1_grad_f64_window", "grad", "m1", ["--dtype", "f64", "--window", "500"]),
    ("m1_grad_wavefront", "grad", "m1", ["--schedule", "wavefront"]),
    ("m1_grad_top", "grad", "m1", ["--cotangent", "top-of-stack"]),
    ("m1_grad_w3_tree", "grad", "m1", W3 + ["--reduce", "tree"]),
    ("m1_grad_w3_star", "grad", "m1", W3 + ["--reduce", "star", "--storage", "bf16"]),
    # Mamba-2 gradients.
    ("m2_grad_f32", "grad", "m2", []),
    ("m2_grad_f64", "grad", "m2", ["--dtype", "f64"]),
    ("m2_grad_bf16", "grad", "m2", ["--storage", "bf16"]),
    ("m2_grad_w3_tree", "grad", "m2", W3 + ["--reduce", "tree"]),
    ("m2_grad_w3_star", "grad", "m2", W3 + ["--reduce", "star"]),
    # 5-step checkpoints (model and optimizer state).
    ("m1_train", "train", "m1", []),
    ("m1_train_bf16", "train", "m1", ["--storage", "bf16"]),
    ("m1_train_window", "train", "m1", ["--window", "300"]),
    ("m1_train_wavefront", "train", "m1", ["--schedule", "wavefront"]),
    ("m1_train_w3_tree", "train", "m1", W3 + ["--reduce", "tree"]),
    ("m1_train_w3_star", "train", "m1", W3 + ["--reduce", "star"]),
    ("m2_train", "train", "m2", []),
    ("m2_train_bf16", "train", "m2", ["--storage", "bf16"]),
    ("m2_train_w3_tree", "train", "m2", W3 + ["--reduce", "tree"]),
    ("m2_train_w3_star", "train", "m2", W3 + ["--reduce", "star"]),
    # Evaluation and decoding.
    ("m1_eval", "evaluate", "m1", []),
    ("m1_eval_w3", "evaluate", "m1", W3),
    ("m2_eval", "evaluate", "m2", []),
    ("m2_eval_w3", "evaluate", "m2", W3),
    ("m1_generate", "generate", "m1", []),
    ("m2_generate", "generate", "m2", []),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adjsh", required=True)
    ap.add_argument("--record", action="store_true",
                    help="write this machine's digests into tests/bits/fixtures.json")
    ap.add_argument("--only", nargs="*", help="run only these cases")
    args = ap.parse_args()
    key = machine_key()
    fixtures = {}
    if os.path.exists(FIXTURES):
        with open(FIXTURES) as f:
            fixtures = json.load(f)
    expected = fixtures.get(key)
    if expected is None and not args.record:
        print(f"SKIPPED: no recorded bits for this machine ({key}); recorded for: "
              f"{sorted(fixtures)}")
        return SKIP
    cases = [c for c in CASES if not args.only or c[0] in args.only]
    got = {}
    with tempfile.TemporaryDirectory(prefix="adjsh-bits-") as tmp:
        r = Runner(os.path.abspath(args.adjsh), tmp)
        r.setup()
        for name, kind, model, flags in cases:
            t = time.monotonic()
            got.update(getattr(r, kind)(name, model, flags))
            print(f"  {name:22s} {time.monotonic() - t:5.1f} s", flush=True)
    if args.record:
        fixtures[key] = dict(sorted({**(expected or {}), **got}.items()))
        with open(FIXTURES, "w") as f:
            json.dump(fixtures, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"recorded {len(got)} digests for {key}")
        return 0
    bad = [k for k in sorted(got) if expected.get(k) != got[k]]
    for k in bad:
        print(f"MOVED: {k}: expected {expected.get(k)}, got {got[k]}")
    print(f"bits: {len(got) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
