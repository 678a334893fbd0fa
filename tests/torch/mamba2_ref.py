"""Mamba-2 in PyTorch from its public definition, for tests: Hugging Face Mamba2ForCausalLM's
file layout, mamba_ssm's Mamba2 block (in_proj -> [z, xBC, dt]; causal depthwise conv and SiLU
over xBC; one scalar decay per head and token; the gated RMSNorm normalised per group of
Di / G channels, as mamba_ssm's RMSNormGated does; out_proj), its SSM as the plain per-token
recurrence (the minimal SSD's definition), batch-free (activations are (T, ...)). The loss is
the mean next-token cross-entropy; autograd gives every parameter's gradient.

Shapes: D hidden, K layers, N state, W conv, E expand, Di = E D, P head_dim, H = Di / P heads,
G groups (H % G == 0; head h reads group h // (H / G)), V vocab. Per token and head h:
    dt_h = softplus(dt_raw_h + dt_bias_h)   (clamped to time_step_limit when it is not (0, inf))
    S_h  = exp(dt_h A_h) S_h + dt_h x_h B_g^T      S_h (P, N), A_h = -exp(A_log_h)
    y_h  = S_h C_g + D_h x_h
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mamba_ref as m1  # noqa: E402  (safetensors and token files)


def make_config(D, K, N, W, E, P, G, V, eps=1e-5, tied=True, limit=(0.0, math.inf),
                norm_before_gate=False, chunk_size=256):
    Di = E * D
    return {"model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"], "hidden_size": D,
            "num_hidden_layers": K, "state_size": N, "conv_kernel": W, "expand": E,
            "head_dim": P, "num_heads": Di // P, "n_groups": G, "vocab_size": V,
            "layer_norm_epsilon": eps, "use_bias": False, "use_conv_bias": True,
            "rms_norm": True, "norm_before_gate": norm_before_gate,
            "time_step_limit": [limit[0], limit[1]], "chunk_size": chunk_size,
            "tie_word_embeddings": tied}


def dims(cfg):
    D, E, P, G, N = (cfg["hidden_size"], cfg["expand"], cfg["head_dim"], cfg["n_groups"],
                     cfg["state_size"])
    Di = E * D
    return D, Di, Di // P, P, G, N, Di + 2 * G * N  # last: conv channels


def param_shapes(cfg):
    D, Di, H, P, G, N, Cc = dims(cfg)
    V, W = cfg["vocab_size"], cfg["conv_kernel"]
    s = {"backbone.embeddings.weight": (V, D), "backbone.norm_f.weight": (D,)}
    for k in range(cfg["num_hidden_layers"]):
        b = f"backbone.layers.{k}."
        s[b + "norm.weight"] = (D,)
        s[b + "mixer.in_proj.weight"] = (2 * Di + 2 * G * N + H, D)
        s[b + "mixer.conv1d.weight"] = (Cc, 1, W)
        s[b + "mixer.conv1d.bias"] = (Cc,)
        s[b + "mixer.dt_bias"] = (H,)
        s[b + "mixer.A_log"] = (H,)
        s[b + "mixer.D"] = (H,)
        s[b + "mixer.norm.weight"] = (Di,)
        s[b + "mixer.out_proj.weight"] = (D, Di)
    if not cfg.get("tie_word_embeddings", True):
        s["lm_head.weight"] = (V, D)
    return s


def init_params(cfg, seed=0, dtype=torch.float64):
    """Random weights at sizes that keep every layer in its working range: dt in [1e-3, 0.1]
    through dt_bias, A in [1, 16], norms near 1."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        u = torch.rand(shape, generator=g, dtype=torch.float64)
        if name.endswith("dt_bias"):
            dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            v = dt + torch.log(-torch.expm1(-dt))  # softplus^-1
        elif name.endswith("A_log"):
            v = torch.log(1 + 15 * u)
        elif name.endswith("mixer.D") or name.endswith("norm.weight"):
            v = 1 + 0.2 * (u - 0.5)
        elif name.endswith("conv1d.bias"):
            v = 0.2 * (u - 0.5)
        else:
            fan_in = shape[-1] if len(shape) > 1 else 1
            v = (2 * u - 1) / math.sqrt(fan_in)
        out[name] = v.to(dtype)
    return out


def save_model(model_dir, cfg, params):
    os.makedirs(model_dir, exist_ok=True)
    m1.save_safetensors(os.path.join(model_dir, "model.safetensors"), params,
                        metadata={"format": "pt"})
    import json
    text = json.dumps(cfg, indent=2)  # Python's json: time_step_limit's inf is "Infinity"
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        f.write(text)


def rmsnorm(u, w, eps):
    return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps) * w


def gated_norm(y, z, w, G, eps, norm_before_gate):
    """mamba_ssm's RMSNormGated with group_size = Di / G."""
    T, Di = y.shape
    if not norm_before_gate:
        y = y * F.silu(z)
    yg = y.view(T, G, Di // G)
    n = (yg * torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + eps)).view(T, Di) * w
    return n * F.silu(z) if norm_before_gate else n


def scan_tokens(S, dt, A, xs, Bh, Ch, Dh):
    """The recurrence over the tokens of dt (t, H), xs (t, H, P), Bh and Ch (t, H, N) from the
    state S (H, P, N): the outputs (t, H P) and the last state."""
    ys = []
    for t in range(dt.shape[0]):
        dA = torch.exp(dt[t] * A)
        S = dA[:, None, None] * S + (dt[t][:, None] * xs[t])[:, :, None] * Bh[t][:, None, :]
        ys.append(((S * Ch[t][:, None, :]).sum(-1) + Dh[:, None] * xs[t]).reshape(-1))
    return torch.stack(ys), S


def scan(dt, A, xs, Bh, Ch, Dh, checkpoint_every=0):
    """y (T, H P). checkpoint_every > 0: autograd keeps only the states between runs of that
    many tokens and recomputes each run in the backward (torch.utils.checkpoint), so that
    long sequences fit in memory; the same values."""
    T, H, P = xs.shape
    S = torch.zeros(H, P, Bh.shape[-1], dtype=xs.dtype)
    if checkpoint_every <= 0:
        return scan_tokens(S, dt, A, xs, Bh, Ch, Dh)[0]
    from torch.utils.checkpoint import checkpoint
    ys = []
    for t0 in range(0, T, checkpoint_every):
        sl = slice(t0, t0 + checkpoint_every)
        y, S = checkpoint(scan_tokens, S, dt[sl], A, xs[sl], Bh[sl], Ch[sl], Dh)
        ys.append(y)
    return torch.cat(ys)


def mixer(x, p, b, cfg):
    D, Di, H, P, G, N, Cc = dims(cfg)
    T, W = x.shape[0], cfg["conv_kernel"]
    zxbcdt = x @ p[b + "in_proj.weight"].T
    z, xBC, dt = torch.split(zxbcdt, [Di, Cc, H], dim=-1)
    conv = F.conv1d(xBC.T.unsqueeze(0), p[b + "conv1d.weight"], p[b + "conv1d.bias"],
                    padding=W - 1, groups=Cc)[0, :, :T].T
    xBC = F.silu(conv)
    xs, B, C = torch.split(xBC, [Di, G * N, G * N], dim=-1)
    dt = F.softplus(dt + p[b + "dt_bias"])
    lo, hi = cfg.get("time_step_limit", [0.0, math.inf])
    if not (lo == 0.0 and hi == math.inf):
        dt = dt.clamp(lo, hi)
    A = -torch.exp(p[b + "A_log"])
    xs = xs.reshape(T, H, P)
    rep = H // G
    Bh = B.reshape(T, G, N).repeat_interleave(rep, dim=1)  # (T, H, N)
    Ch = C.reshape(T, G, N).repeat_interleave(rep, dim=1)
    y = scan(dt, A, xs, Bh, Ch, p[b + "D"], cfg.get("checkpoint_every", 0))
    y = gated_norm(y, z, p[b + "norm.weight"], G, cfg["layer_norm_epsilon"],
                   cfg.get("norm_before_gate", False))
    return y @ p[b + "out_proj.weight"].T


def logits_fn(p, cfg, tokens):
    """(T, V) logits of every row."""
    eps = cfg["layer_norm_epsilon"]
    h = p["backbone.embeddings.weight"][tokens]
    for k in range(cfg["num_hidden_layers"]):
        b = f"backbone.layers.{k}."
        if cfg.get("round_inputs_bf16"):  # adjsh's --storage bf16: each layer reads its input
            h = h + (h.to(torch.bfloat16).to(h.dtype) - h).detach()  # rounded (derivative 1)
        h = h + mixer(rmsnorm(h, p[b + "norm.weight"], eps), p, b + "mixer.", cfg)
    h = rmsnorm(h, p["backbone.norm_f.weight"], eps)
    return h @ p.get("lm_head.weight", p["backbone.embeddings.weight"]).T


def loss_fn(p, cfg, tokens):
    return F.cross_entropy(logits_fn(p, cfg, tokens)[:-1], tokens[1:])


def grads_params(cfg, params, tokens, dtype=torch.float64):
    p = {n: v.detach().to(dtype).requires_grad_(True) for n, v in params.items()}
    loss = loss_fn(p, cfg, torch.as_tensor(tokens, dtype=torch.long))
    loss.backward()
    return float(loss), {n: v.grad.to(torch.float64) for n, v in p.items()}
