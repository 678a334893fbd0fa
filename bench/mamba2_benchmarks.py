#!/work/main/.venv/bin/python
"""Mamba-2's exact gradient (`adjsh grad` on a model_type "mamba2" folder) against PyTorch
autograd of the reference (tests/torch/mamba2_ref.py) on this CPU, and its memory in T.

  .venv/bin/python bench/mamba2_benchmarks.py [--build build] [--lengths 4096,16384]
      [--torch-lengths 4096] [--torch-checkpoint-lengths 4096,16384] [--checkpoint-every 256]
      [--memory-lengths 16384,65536] [--span-lengths 4096,16384] [--worker-lengths 16384]
      [--json FILE]

Model: D=256, K=4, N=64, head_dim 32 (H=16), G=1, W=4, V=256, synthetic weights; chunk 256.
  adjsh s        `adjsh grad`'s own time of the gradient, f32, one span on one thread (the
                 plain chunk-by-chunk pass; OpenBLAS runs single-threaded inside adjsh)
  spans s        the same with the default spans (engine/span_math.h) on 1 and 2 threads
  workers s      the same default spans on 1 and 2 local worker processes (`--workers`, one
                 thread each; the gradient's time, after the workers registered)
  torch s        loss.backward() of the reference after its forward, f32, torch.set_num_threads(1)
                 (the reference's scan is a loop over tokens, as the minimal definition is)
  ckpt s         the same with the reference's scan checkpointed every 256 tokens
                 (torch.utils.checkpoint: only the states between runs are kept, each run is
                 recomputed in the backward, as adjsh recomputes each chunk): what fits at 16K
  ratio          torch s / adjsh s and ckpt s / adjsh s, all in this run
  GFLOP/s        the gradient's GEMM and scan FLOPs (counted below) over adjsh s
  peak MiB       `adjsh grad`'s peak RSS; the slope between the two memory lengths is the
                 memory per token (at those lengths also with --storage bf16)
FLOPs counted per token and layer, as engine/mamba2_grad.cc runs them: the in_proj GEMM
(2 Dp D) three times (the forward, the backward's state sweep, the chunk's recompute), the
out_proj GEMM (2 D Di) twice (the sweep keeps states only), both twice more for their
backward; the LM head (2 V D) three times; the scan in the block form that chunk 256 uses
(kernels/cpu/mamba2_scan_blocks.cc, blocks of Q = 64 rows), per token: forward 2 Q P + 4 P N per
head and 2 Q N per group (C B^T), twice (the forward and the recompute); the states-only sweep
2 P N per head; the backward 4 Q P + 4 Q N + 10 P N per head and 2 Q N per group. The block
form does more FLOPs than the token-by-token recurrence (4 P N forward, 14 P N backward), as
GEMMs.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
import mamba2_ref as ref  # noqa: E402
import mamba_ref as m1  # noqa: E402

GRAD = re.compile(r"loss ([\d.]+)\s+tokens (\d+)\s+([\d.]+) s .* peak RSS ([\d.]+) MiB")
SHAPE = dict(D=256, K=4, N=64, W=4, E=2, P=32, G=1, V=256)


def flops_per_token(cfg, Q=64):
    D, Di, H, P, G, N, Cc = ref.dims(cfg)
    Dp, V, K = 2 * Di + 2 * G * N + H, cfg["vocab_size"], cfg["num_hidden_layers"]
    in_proj, out_proj = 2 * Dp * D, 2 * D * Di
    scan_fwd = H * (2 * Q * P + 4 * P * N) + G * 2 * Q * N
    scan_bwd = H * (4 * Q * P + 4 * Q * N + 10 * P * N) + G * 2 * Q * N
    layer = (3 * in_proj + 2 * out_proj + 2 * (in_proj + out_proj) +
             2 * scan_fwd + H * 2 * P * N + scan_bwd)
    return K * layer + 3 * 2 * V * D


def adjsh_grad(adjsh, model, tokens, out, storage="full", spans=1, threads=1, workers=0):
    p = subprocess.run([adjsh, "grad", "--model", model, "--tokens", tokens, "--out", out,
                        "--chunk", "256", "--storage", storage, "--spans", str(spans),
                        "--threads", str(threads), "--workers", str(workers)],
                       capture_output=True, text=True)
    g = GRAD.search(p.stderr)
    if p.returncode != 0 or not g:
        sys.exit(f"adjsh grad failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return float(g.group(3)), float(g.group(4)), float(g.group(1))


def torch_grad(cfg, params, tok, checkpoint_every=0):
    torch.set_num_threads(1)
    cfg = dict(cfg, checkpoint_every=checkpoint_every)
    p = {n: v.float().requires_grad_(True) for n, v in params.items()}
    t0 = time.perf_counter()
    loss = ref.loss_fn(p, cfg, torch.tensor(tok))
    loss.backward()
    return time.perf_counter() - t0, float(loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--torch-lengths", default="4096",
                    help="lengths PyTorch runs too (its autograd keeps every token's state: 16K "
                    "needs about 32 GiB)")
    ap.add_argument("--torch-checkpoint-lengths", default="",
                    help="lengths PyTorch runs with its scan checkpointed (fits at 16K)")
    ap.add_argument("--checkpoint-every", type=int, default=256)
    ap.add_argument("--memory-lengths", default="16384,65536")
    ap.add_argument("--span-lengths", default="4096,16384",
                    help="lengths also run with the default spans on 1 and 2 threads")
    ap.add_argument("--worker-lengths", default="16384",
                    help="lengths also run with the default spans on 1 and 2 local workers")
    ap.add_argument("--json")
    args = ap.parse_args()
    adjsh = os.path.join(args.build, "cli", "adjsh")
    cfg = ref.make_config(**SHAPE)
    params = ref.init_params(cfg, seed=1)
    work = tempfile.mkdtemp(prefix="adjsh_mamba2_bench_")
    model = os.path.join(work, "model")
    ref.save_model(model, cfg, {n: v.float() for n, v in params.items()})
    lengths = sorted({int(x) for x in (args.lengths + "," + args.memory_lengths).split(",")
                      if x})
    torch_lengths = {int(x) for x in args.torch_lengths.split(",") if x}
    ckpt_lengths = {int(x) for x in args.torch_checkpoint_lengths.split(",") if x}
    fpt = flops_per_token(cfg)
    mem_lengths = {int(x) for x in args.memory_lengths.split(",") if x}
    span_lengths = {int(x) for x in args.span_lengths.split(",") if x}
    worker_lengths = {int(x) for x in args.worker_lengths.split(",") if x}
    rows = []
    for T in lengths:
        g = torch.Generator().manual_seed(T)
        tok = torch.randint(0, cfg["vocab_size"], (T,), generator=g).tolist()
        tpath = os.path.join(work, f"t{T}.u32")
        m1.write_tokens(tpath, tok)
        secs, mib, loss = adjsh_grad(adjsh, model, tpath, os.path.join(work, "g.safetensors"))
        row = {"T": T, "adjsh_s": secs, "peak_mib": mib, "gflops": fpt * T / secs / 1e9,
               "loss": loss}
        if T in span_lengths:  # the span schedule's default spans, on 1 and on 2 threads
            for threads in (1, 2):
                row[f"spans_{threads}t_s"], _, _ = adjsh_grad(
                    adjsh, model, tpath, os.path.join(work, "g.safetensors"), spans=0,
                    threads=threads)
        if T in worker_lengths:  # the same spans on local worker processes
            for workers in (1, 2):
                row[f"workers_{workers}_s"], _, _ = adjsh_grad(
                    adjsh, model, tpath, os.path.join(work, "g.safetensors"), spans=0,
                    workers=workers)
        if T in mem_lengths:  # the layer inputs in bf16 (--storage bf16)
            row["bf16_s"], row["bf16_peak_mib"], _ = adjsh_grad(
                adjsh, model, tpath, os.path.join(work, "g.safetensors"), "bf16")
        if T in torch_lengths:
            row["torch_s"], row["torch_loss"] = torch_grad(cfg, params, tok)
        if T in ckpt_lengths:
            row["ckpt_s"], row["ckpt_loss"] = torch_grad(cfg, params, tok, args.checkpoint_every)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| T | adjsh s | torch s | ratio | ckpt s | ratio | GFLOP/s | peak MiB | "
          "spans 1 thread s | spans 2 threads s | 1 worker s | 2 workers s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = []
        for key in ("torch_s", "ckpt_s"):
            cells += ([f"{r[key]:.2f}", f"{r[key] / r['adjsh_s']:.1f}x"] if key in r
                      else ["-", "-"])
        spans = [f"{r[k]:.2f}" if k in r else "-"
                 for k in ("spans_1t_s", "spans_2t_s", "workers_1_s", "workers_2_s")]
        print(f"| {r['T']:,} | {r['adjsh_s']:.2f} | {' | '.join(cells)} | {r['gflops']:.1f} | "
              f"{r['peak_mib']:.0f} | {' | '.join(spans)} |")
    mem = [int(x) for x in args.memory_lengths.split(",") if x]
    if len(mem) == 2:
        a = next(r for r in rows if r["T"] == mem[0])
        b = next(r for r in rows if r["T"] == mem[1])
        for key, what in (("peak_mib", "full storage"), ("bf16_peak_mib", "--storage bf16")):
            slope = (b[key] - a[key]) * 1048576 / (b["T"] - a["T"])
            print(f"peak RSS slope {slope:.0f} B/token ({mem[0]} to {mem[1]} tokens, {what})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
