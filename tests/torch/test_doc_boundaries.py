#!/usr/bin/python3
"""Check `adjsh grad --doc-starts` (the masked model of `--doc-boundaries reset`: neither the
recurrence nor the causal conv reads across a document start; engine/segments.h) against
PyTorch autograd of that model written directly (tests/torch/mamba_ref.py with `starts`: the
scan's state zeroed at each start, the conv's taps before it dropped), f64 < 1e-9 and f32 < 1e-4
relative per tensor, for K = 1, 2, 3 and chunks 1, 7 and T; documents shorter than the conv
kernel, a start at the last token, several starts in one chunk; and that without the starts the
gradient differs (the mask is not a no-op). Bad starts files are refused.

  /usr/bin/python3 tests/torch/test_doc_boundaries.py --adjsh build/cli/adjsh
Exits non-zero on any failure.
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
import mamba_ref as ref  # noqa: E402
from harness import Results  # noqa: E402

T = 41
STARTS = [2, 3, 9, 17, 18, 30, 40]  # docs of 1, 6, 8, 1, 12 and 10 tokens; a start at T - 1


def rel(a, b):
    return (torch.linalg.vector_norm(a - b) / max(torch.linalg.vector_norm(b), 1e-300)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    a = ap.parse_args()
    torch.set_num_threads(2)
    res = Results()
    check = res.record

    with tempfile.TemporaryDirectory() as work:
        starts = os.path.join(work, "starts.u64")
        with open(starts, "wb") as f:
            f.write(struct.pack(f"<{len(STARTS)}Q", *STARTS))
        for K in (1, 2, 3):
            cfg = ref.make_config(8, K, 4, 4, 2, "auto", 13)
            params = ref.init_params(cfg, seed=10 + K, dtype=torch.float64, perturb=True)
            mdir = os.path.join(work, f"m{K}")
            ref.save_model(mdir, cfg, params)
            tokens = torch.randint(0, cfg["V"], (T,), generator=torch.Generator().manual_seed(K))
            tok = os.path.join(work, f"t{K}.u32")
            ref.write_tokens(tok, tokens)
            loss, want = ref.grads_params(cfg, params, tokens, starts=STARTS)
            _, cross = ref.grads_params(cfg, params, tokens)
            check(f"K={K}: the mask changes the torch gradient",
                  max(rel(want[n], cross[n]) for n in want) > 1e-3)
            for chunk in (1, 7, T):
                for dtype, tol in (("f64", 1e-9), ("f32", 1e-4)):
                    out = os.path.join(work, f"g{K}-{chunk}-{dtype}.safetensors")
                    r = subprocess.run([a.adjsh, "grad", "--model", mdir, "--tokens", tok,
                                        "--out", out, "--dtype", dtype, "--chunk", str(chunk),
                                        "--doc-starts", starts, "--quiet"],
                                       capture_output=True, text=True)
                    if r.returncode != 0:
                        check(f"K={K} chunk={chunk} {dtype}", False, r.stderr)
                        continue
                    got = ref.load_safetensors(out)
                    worst = max((rel(got[n].to(torch.float64), w), n) for n, w in want.items())
                    dl = abs(float(got["loss"]) - loss) / abs(loss)
                    check(f"K={K} chunk={chunk} {dtype}: adjsh vs torch masked model "
                          f"{worst[0]:.2e} ({worst[1]}), loss {dl:.1e}",
                          worst[0] < tol and dl < tol, worst)
        bad = os.path.join(work, "bad.u64")
        for name, data, what in (("unordered", struct.pack("<2Q", 9, 3), "out of order"),
                                 ("past the end", struct.pack("<1Q", T), "out of order or past"),
                                 ("truncated", bytes([1, 2, 3]), "whole number")):
            with open(bad, "wb") as f:
                f.write(data)
            out = os.path.join(work, "bad.safetensors")
            r = subprocess.run([a.adjsh, "grad", "--model", os.path.join(work, "m1"), "--tokens",
                                os.path.join(work, "t1.u32"), "--out", out, "--doc-starts", bad],
                               capture_output=True, text=True)
            check(f"--doc-starts {name}: exit 1 naming it, nothing written",
                  r.returncode == 1 and what in r.stderr and not os.path.exists(out), r.stderr)
    return res.summary()


if __name__ == "__main__":
    sys.exit(main())
