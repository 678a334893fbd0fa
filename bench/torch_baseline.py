#!/usr/bin/python3
"""PyTorch autograd baseline: time and memory of one exact gradient of the Mamba-1 LM (CPU, or
a CUDA GPU with --device cuda).

The model is tests/torch/mamba_ref.py (docs/MATH.md "Forward", HF layout): discretisation vectorised
over tokens, then the sequential selective scan over tokens as in mamba_ssm's selective_scan_ref /
HF MambaMixer's slow path, i.e. the standard non-fused peer. Its backward keeps exp(Delta A),
Delta B x' and h for every (token, layer): (T, Di, N) tensors, the backprop line of docs/MATH.md
"Memory". --checkpoint-layers wraps every layer in
torch.utils.checkpoint (keeps only the layer inputs, recomputes one layer at a time in backward).

Run one configuration per process (peak RSS is per process):
  /usr/bin/python3 bench/torch_baseline.py --hidden-size 256 --layers 4 --state-size 16 \
      --vocab-size 256 --tokens 4096 [--checkpoint-layers] [--dtype f32]
Prints one JSON object: tokens, seconds (forward+backward of the measured step), tokens_per_s,
peak_rss_bytes (getrusage ru_maxrss*1024), rss_before_bytes (current RSS just before the step),
bytes_per_token = (peak_rss - rss_before) / T, and the configuration; with --device cuda also
cuda_peak_bytes (torch.cuda.max_memory_allocated over the measured step).
"""
import argparse
import gc
import json
import os
import platform
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "torch"))
import mamba_ref as ref  # noqa: E402


def current_rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden-size", type=int, default=256)    # D
    ap.add_argument("--layers", type=int, default=4)           # K
    ap.add_argument("--state-size", type=int, default=16)      # N
    ap.add_argument("--vocab-size", type=int, default=256)     # V
    ap.add_argument("--conv-kernel", type=int, default=4)      # W
    ap.add_argument("--expand", type=int, default=2)           # E, Di = E*D
    ap.add_argument("--dt-rank", default="auto")               # R
    ap.add_argument("--tokens", type=int, required=True)       # T
    ap.add_argument("--checkpoint-layers", action="store_true")
    ap.add_argument("--dtype", choices=["f32", "f64"], default="f32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup-tokens", type=int, default=64, help="warm-up step length (0: none)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    dtype = {"f32": torch.float32, "f64": torch.float64}[a.dtype]
    cfg = ref.make_config(a.hidden_size, a.layers, a.state_size, a.conv_kernel, a.expand,
                          a.dt_rank, a.vocab_size)
    params = ref.init_params(cfg, seed=a.seed, dtype=dtype, perturb=False)
    gen = torch.Generator().manual_seed(a.seed + 1)
    tokens = torch.randint(0, cfg["V"], (a.tokens,), generator=gen)
    cuda = a.device == "cuda"
    if cuda:
        params = {k: v.cuda() for k, v in params.items()}
        tokens = tokens.cuda()

    if a.warmup_tokens >= 2:
        wt = torch.randint(0, cfg["V"], (a.warmup_tokens,), generator=gen).to(a.device)
        ref.grads_params(cfg, params, wt, dtype, a.checkpoint_layers)

    gc.collect()
    rss_before = current_rss_bytes()
    peak_before = peak_rss_bytes()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    loss, g = ref.grads_params(cfg, params, tokens, dtype, a.checkpoint_layers)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = peak_rss_bytes()
    assert all(torch.isfinite(v).all() for v in g.values())

    print(json.dumps({
        "impl": "pytorch-autograd" + ("+checkpoint-layers" if a.checkpoint_layers else ""),
        "scan": "sequential over tokens (selective_scan_ref / HF slow path)",
        "tokens": a.tokens,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(a.tokens / seconds, 2),
        "peak_rss_bytes": peak,
        "rss_before_bytes": rss_before,
        "peak_rss_before_step_bytes": peak_before,
        "bytes_per_token": round((peak - rss_before) / a.tokens, 1),
        "loss": loss,
        "dtype": a.dtype,
        "threads": a.threads,
        "checkpoint_layers": a.checkpoint_layers,
        "config": {k: cfg[k] for k in ("D", "K", "N", "W", "E", "Di", "R", "V")},
        "torch": torch.__version__,
        "machine": platform.machine(),
        "device": a.device,
        **({"cuda_peak_bytes": torch.cuda.max_memory_allocated(),
            "cuda_device": torch.cuda.get_device_name()} if cuda else {}),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
