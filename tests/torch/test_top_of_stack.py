#!/usr/bin/python3
"""Check `adjsh grad --cotangent top-of-stack` (the paper's Proposition 3 read literally,
docs/MATH.md "The adjoint of the scan") against PyTorch autograd of the same definition:

  g     = dL/du^{K+1}                      (autograd through the final norm, head and loss)
  layer k's parameter gradient = VJP of u^{k+1} = layer_k(u^k) with cotangent g, u^k held fixed
  embedding gradient = the head's part + scatter of layer 1's input VJP (cotangent g)

on the independent model of tests/torch/mamba_ref.py, f64, for K = 1, 2, 3; and that for K = 1
it equals the exact autograd gradient while for K > 1 it differs from it (so the option is not
the exact gradient under another name).

  /usr/bin/python3 tests/torch/test_top_of_stack.py --adjsh build/cli/adjsh
Exits non-zero on any failure.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from collections import OrderedDict

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mamba_ref as ref  # noqa: E402

TOL = 1e-9  # f64 on both sides; the exact path meets 1e-9 in test_against_torch.py


def top_of_stack_grads(cfg, params, tokens):
    p = OrderedDict((k, v.detach().clone().requires_grad_(True)) for k, v in params.items())
    E = p["backbone.embeddings.weight"]
    inputs = [E[tokens].detach()]                      # u^1, ..., u^K, held fixed
    with torch.no_grad():
        for k in range(cfg["K"]):
            inputs.append(ref.layer(inputs[-1], p, k, cfg))
    top = inputs[-1].clone().requires_grad_(True)      # u^{K+1}
    loss = torch.nn.functional.cross_entropy(ref.logits_fn(top, p, cfg)[:-1], tokens[1:])
    names = list(p)
    head = torch.autograd.grad(loss, [top] + [p[n] for n in names], allow_unused=True)
    g = head[0]
    grads = OrderedDict((n, torch.zeros_like(p[n]) if x is None else x.clone())
                        for n, x in zip(names, head[1:]))
    for k in range(cfg["K"]):
        u = inputs[k].clone().requires_grad_(True)
        out = ref.layer(u, p, k, cfg)
        pre = f"backbone.layers.{k}."
        own = [n for n in names if n.startswith(pre)]
        vj = torch.autograd.grad(out, [u] + [p[n] for n in own], grad_outputs=g)
        for n, x in zip(own, vj[1:]):
            grads[n] += x
        if k == 0:
            grads["backbone.embeddings.weight"].index_add_(0, tokens, vj[0])
    return loss.item(), grads


def rel(a, b):
    return (torch.linalg.vector_norm(a - b) / max(torch.linalg.vector_norm(b), 1e-300)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adjsh", required=True)
    a = ap.parse_args()
    torch.set_num_threads(2)
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        for K in (1, 2, 3):
            cfg = ref.make_config(8, K, 4, 4, 2, "auto", 11)
            params = ref.init_params(cfg, seed=K, dtype=torch.float64, perturb=True)
            mdir = os.path.join(work, f"m{K}")
            ref.save_model(mdir, cfg, params)
            gen = torch.Generator().manual_seed(K)
            tokens = torch.randint(0, cfg["V"], (29,), generator=gen)
            tok = os.path.join(work, f"t{K}.u32")
            ref.write_tokens(tok, tokens)
            out = os.path.join(work, f"g{K}.safetensors")
            subprocess.run([a.adjsh, "grad", "--model", mdir, "--tokens", tok, "--out", out,
                            "--dtype", "f64", "--chunk", "7", "--cotangent", "top-of-stack",
                            "--quiet"], check=True)
            got = ref.load_safetensors(out)
            loss, want = top_of_stack_grads(cfg, params, tokens)
            _, exact = ref.grads_params(cfg, params, tokens)
            worst = max((rel(got[n].to(torch.float64), w), n) for n, w in want.items())
            vs_exact = max(rel(want[n], exact[n]) for n in want)
            ok = worst[0] < TOL and abs(float(got["loss"]) - loss) < 1e-12 * max(1, abs(loss))
            ok = ok and (vs_exact < 1e-12 if K == 1 else vs_exact > 1e-4)
            print(f"K={K}: adjsh vs torch top-of-stack {worst[0]:.2e} ({worst[1]}), "
                  f"torch top-of-stack vs exact {vs_exact:.2e}: {'ok' if ok else 'FAIL'}")
            failures += not ok
    print(f"{3 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
