#!/usr/bin/python3
"""Independent PyTorch reference for the Mamba-1 causal LM of docs/MATH.md "Forward".

Written from the public Mamba definition (mamba_ssm's selective_scan_ref and the slow path of
Hugging Face's MambaMixer), with HF MambaForCausalLM parameter names and shapes. Gradients come
from PyTorch autograd, so this file shares no code or derivation with the C++ adjoint engine.

Shape letters: T tokens, D width, Di inner width (= E*D), N state, R dt rank, W conv kernel,
K layers, V vocab.

Also here, because no `safetensors` package is available: a minimal safetensors reader/writer
(F64, F32, BF16, plus F16/I64/I32/U8 for convenience), a config.json reader and a token file reader.

CLI (run with /usr/bin/python3, which has torch):
  mamba_ref.py grad --model DIR --tokens FILE --out OUT.safetensors [--dtype f32|f64]
  mamba_ref.py loss --model DIR --tokens FILE [--dtype f32|f64]
"""
import argparse
import json
import math
import os
import struct
import sys
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------
# safetensors
# ----------------------------------------------------------------------------------------------
# name -> (numpy little-endian dtype of the raw bytes, torch dtype, bytes per element)
_ST_DTYPES = {
    "F64": ("<f8", torch.float64, 8),
    "F32": ("<f4", torch.float32, 4),
    "F16": ("<f2", torch.float16, 2),
    "BF16": ("<i2", torch.bfloat16, 2),  # raw 16-bit pattern, reinterpreted below
    "I64": ("<i8", torch.int64, 8),
    "I32": ("<i4", torch.int32, 4),
    "U8": ("<u1", torch.uint8, 1),
}
_TORCH_TO_ST = {v[1]: k for k, v in _ST_DTYPES.items()}


def load_safetensors(path):
    """Return an OrderedDict name -> torch tensor in the stored dtype (file order of offsets)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if 8 + hlen > len(raw):
        raise ValueError(f"{path}: header length {hlen} beyond end of file")
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
    entries.sort(key=lambda kv: kv[1]["data_offsets"][0])
    out = OrderedDict()
    for name, info in entries:
        dt = info["dtype"]
        if dt not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        npdt, tdt, size = _ST_DTYPES[dt]
        shape = [int(s) for s in info["shape"]]
        b, e = (int(o) for o in info["data_offsets"])
        numel = int(np.prod(shape)) if shape else 1
        if e - b != numel * size or base + e > len(raw):
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {b},{e} for {dt}{shape}")
        arr = np.frombuffer(raw, dtype=npdt, count=numel, offset=base + b).copy().reshape(shape)
        t = torch.from_numpy(arr.astype(npdt[1:]))  # native byte order
        if dt == "BF16":
            t = t.view(torch.bfloat16)
        out[name] = t
    return out


def save_safetensors(path, tensors, metadata=None):
    """Write {name: tensor} (F64/F32/BF16/...) in the given order; header padded to 8 bytes."""
    header = OrderedDict()
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, off = [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in _TORCH_TO_ST:
            raise ValueError(f"tensor {name}: unsupported dtype {t.dtype}")
        st = _TORCH_TO_ST[t.dtype]
        npdt = _ST_DTYPES[st][0]
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        data = t.numpy().astype(npdt).tobytes()
        header[name] = {"dtype": st, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# config, parameters, tokens
# ----------------------------------------------------------------------------------------------
def normalize_config(c):
    """config.json dict -> dict of ints/floats with the letters used here."""
    D = int(c["hidden_size"])
    R = c.get("time_step_rank", "auto")
    R = math.ceil(D / 16) if R == "auto" else int(R)
    E = int(c.get("expand", 2))
    Di = int(c.get("intermediate_size", E * D))  # HF writes both; they must agree
    if Di != E * D:
        raise ValueError(f"intermediate_size {Di} != expand*hidden_size {E * D}")
    cfg = dict(D=D, K=int(c["num_hidden_layers"]), N=int(c.get("state_size", 16)),
               W=int(c.get("conv_kernel", 4)), E=E, Di=Di, R=R, V=int(c["vocab_size"]),
               eps=float(c.get("layer_norm_epsilon", 1e-5)),
               tied=bool(c.get("tie_word_embeddings", True)))
    if c.get("use_bias", False):
        raise ValueError("use_bias=true is not part of the adjsh model")
    if not c.get("use_conv_bias", True):
        raise ValueError("use_conv_bias=false is not part of the adjsh model")
    return cfg


def read_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return normalize_config(json.load(f))


def hf_config(cfg):
    """Inverse of normalize_config: a config.json dict in HF MambaConfig keys."""
    return {"architectures": ["MambaForCausalLM"], "model_type": "mamba",
            "hidden_size": cfg["D"], "num_hidden_layers": cfg["K"], "state_size": cfg["N"],
            "conv_kernel": cfg["W"], "expand": cfg["E"], "intermediate_size": cfg["Di"],
            "time_step_rank": cfg["R"], "vocab_size": cfg["V"],
            "layer_norm_epsilon": cfg["eps"], "use_bias": False, "use_conv_bias": True,
            "tie_word_embeddings": cfg.get("tied", True)}


def make_config(D, K, N, W, E, R, V, eps=1e-5, tied=True):
    R = math.ceil(D / 16) if R in ("auto", None) else int(R)
    return dict(D=D, K=K, N=N, W=W, E=E, Di=E * D, R=R, V=V, eps=eps, tied=tied)


def param_shapes(cfg):
    """OrderedDict name -> shape, exactly the HF MambaForCausalLM layout (lm_head.weight last
    when the head is untied)."""
    D, N, W, Di, R, V = cfg["D"], cfg["N"], cfg["W"], cfg["Di"], cfg["R"], cfg["V"]
    s = OrderedDict()
    s["backbone.embeddings.weight"] = (V, D)
    for k in range(cfg["K"]):
        p = f"backbone.layers.{k}."
        s[p + "norm.weight"] = (D,)
        s[p + "mixer.in_proj.weight"] = (2 * Di, D)
        s[p + "mixer.conv1d.weight"] = (Di, 1, W)
        s[p + "mixer.conv1d.bias"] = (Di,)
        s[p + "mixer.x_proj.weight"] = (R + 2 * N, Di)
        s[p + "mixer.dt_proj.weight"] = (Di, R)
        s[p + "mixer.dt_proj.bias"] = (Di,)
        s[p + "mixer.A_log"] = (Di, N)
        s[p + "mixer.D"] = (Di,)
        s[p + "mixer.out_proj.weight"] = (D, Di)
    s["backbone.norm_f.weight"] = (D,)
    if not cfg.get("tied", True):
        s["lm_head.weight"] = (V, D)
    return s


def init_params(cfg, seed=0, dtype=torch.float64, perturb=True):
    """Random parameters, roughly Mamba's init (A_log = log(1..N), dt bias = softplus^-1(dt) for
    dt log-uniform in [1e-3, 0.1]). With perturb=True the norm weights, D and A_log are jittered
    so that no gradient is structurally symmetric (better for testing)."""
    g = torch.Generator().manual_seed(seed)
    D, N, W, Di, R = cfg["D"], cfg["N"], cfg["W"], cfg["Di"], cfg["R"]

    def rn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    def ru(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    p = OrderedDict()
    for name, shape in param_shapes(cfg).items():
        if name.endswith("embeddings.weight") or name == "lm_head.weight":
            t = rn(*shape, std=D ** -0.5)  # the head: logits ~ O(1)
        elif name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            t = 1.0 + (0.2 * rn(*shape) if perturb else torch.zeros(shape, dtype=torch.float64))
        elif name.endswith("in_proj.weight"):
            t = rn(*shape, std=D ** -0.5)
        elif name.endswith("conv1d.weight"):
            t = rn(*shape, std=W ** -0.5)
        elif name.endswith("conv1d.bias"):
            t = rn(*shape, std=0.1)
        elif name.endswith("x_proj.weight"):
            t = rn(*shape, std=Di ** -0.5)
        elif name.endswith("dt_proj.weight"):
            t = rn(*shape, std=R ** -0.5)
        elif name.endswith("dt_proj.bias"):
            dt = torch.exp(ru(*shape) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            t = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
        elif name.endswith("A_log"):
            t = torch.log(torch.arange(1, N + 1, dtype=torch.float64)).repeat(Di, 1)
            if perturb:
                t = t + 0.1 * rn(*shape)
        elif name.endswith("mixer.D"):
            t = 1.0 + (0.2 * rn(*shape) if perturb else torch.zeros(shape, dtype=torch.float64))
        elif name.endswith("out_proj.weight"):
            t = rn(*shape, std=Di ** -0.5)
        else:
            raise AssertionError(name)
        p[name] = t.reshape(shape).to(dtype)
    return p


def save_model(model_dir, cfg, params):
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(hf_config(cfg), f, indent=2)
    save_safetensors(os.path.join(model_dir, "model.safetensors"), params)


def load_model(model_dir, dtype):
    """(cfg, OrderedDict name -> tensor in `dtype`), checking names and shapes."""
    cfg = read_config(model_dir)
    stored = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    params = OrderedDict()
    for name, shape in param_shapes(cfg).items():
        if name not in stored:
            raise KeyError(f"{model_dir}: missing parameter {name}")
        if tuple(stored[name].shape) != tuple(shape):
            raise ValueError(f"{name}: stored shape {tuple(stored[name].shape)} != {shape}")
        params[name] = stored[name].to(dtype)
    return cfg, params


def read_tokens(path):
    """.u32 / .u16 raw little-endian ids -> int64 tensor (T,)."""
    if path.endswith(".u32"):
        dt = "<u4"
    elif path.endswith(".u16"):
        dt = "<u2"
    else:
        raise ValueError(f"{path}: token file must end in .u32 or .u16")
    return torch.from_numpy(np.fromfile(path, dtype=dt).astype(np.int64))


def write_tokens(path, tokens):
    dt = "<u4" if path.endswith(".u32") else "<u2" if path.endswith(".u16") else None
    if dt is None:
        raise ValueError(f"{path}: token file must end in .u32 or .u16")
    np.asarray(tokens, dtype=np.int64).astype(dt).tofile(path)


# ----------------------------------------------------------------------------------------------
# the model (docs/MATH.md "Forward"), batch-free: activations are (T, ...)
# ----------------------------------------------------------------------------------------------
def rmsnorm(u, w, eps):
    # u: (T, D), w: (D,). Computed in the dtype of the run (not upcast as HF does for bf16).
    return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps) * w


def selective_scan(dA, dBx, resets=()):
    """h_t = dA_t . h_{t-1} + dBx_t, h_0 = 0. dA, dBx: (T, Di, N) -> h: (T, Di, N). At each t in
    resets (document starts) the state starts again from 0: h_t = dBx_t.

    Sequential over tokens, as in mamba_ssm's selective_scan_ref. unbind() instead of dA[t] keeps
    autograd's backward O(T): a select's backward would materialise a (T, Di, N) zero tensor per
    token."""
    dA_t, dBx_t = dA.unbind(0), dBx.unbind(0)
    resets = set(resets)
    h = torch.zeros_like(dBx_t[0])  # (Di, N)
    hs = []
    for t in range(len(dA_t)):
        h = dBx_t[t] if t in resets else dA_t[t] * h + dBx_t[t]
        hs.append(h)
    return torch.stack(hs, 0)


def mixer(n, p, pre, cfg, starts=()):
    """Mamba-1 mixer on normalised input n: (T, D) -> (T, D). p: params, pre: name prefix.
    starts: document starts where the conv and the scan begin afresh (nothing before a start is
    read by the rows from it on)."""
    T = n.shape[0]
    Di, N, R, W = cfg["Di"], cfg["N"], cfg["R"], cfg["W"]
    xz = n @ p[pre + "in_proj.weight"].t()                       # (T, 2Di)
    x, z = xz[:, :Di], xz[:, Di:]                                # [x; z] order, each (T, Di)
    # causal depthwise conv: c_t = b + sum_j w[:, j] * x_{t-W+1+j}, x_{<0} = 0
    w = p[pre + "conv1d.weight"][:, 0, :]                        # (Di, W)
    xpad = torch.cat([x.new_zeros(W - 1, Di), x], 0)            # (T+W-1, Di)
    c = p[pre + "conv1d.bias"].expand(T, Di)
    # doc[t]: the start of t's document; tap j of row t reads row t - W + 1 + j
    doc = torch.zeros(T, dtype=torch.long)
    for s0 in sorted(starts):
        doc[s0:] = s0
    rows = torch.arange(T)
    for j in range(W):
        keep = ((rows - (W - 1) + j) >= doc).to(n.dtype)[:, None]  # (T, 1)
        c = c + xpad[j:j + T] * w[:, j] * keep                   # (T, Di)
    xc = F.silu(c)                                               # x': (T, Di)
    dbc = xc @ p[pre + "x_proj.weight"].t()                      # (T, R+2N)
    d, B, C = dbc[:, :R], dbc[:, R:R + N], dbc[:, R + N:]        # (T,R), (T,N), (T,N)
    delta = F.softplus(d @ p[pre + "dt_proj.weight"].t() + p[pre + "dt_proj.bias"])  # (T, Di)
    A = -torch.exp(p[pre + "A_log"])                             # (Di, N)
    dA = torch.exp(delta[:, :, None] * A[None])                  # (T, Di, N)
    dBx = (delta * xc)[:, :, None] * B[:, None, :]               # (T, Di, N)
    h = selective_scan(dA, dBx, starts)                          # (T, Di, N)
    y = torch.einsum("tdn,tn->td", h, C) + p[pre + "D"] * xc     # (T, Di)
    o = y * F.silu(z)                                            # (T, Di)
    return o @ p[pre + "out_proj.weight"].t()                    # (T, D)


def layer(u, p, k, cfg, starts=()):
    """Residual block k: (T, D) -> (T, D)."""
    pre = f"backbone.layers.{k}."
    return u + mixer(rmsnorm(u, p[pre + "norm.weight"], cfg["eps"]), p, pre + "mixer.", cfg,
                     starts)


def logits_fn(u, p, cfg):
    # logits = H rmsnorm(u; w_norm_f), (T, V), H = lm_head.weight when untied, else the embedding
    head = p["backbone.embeddings.weight"] if cfg.get("tied", True) else p["lm_head.weight"]
    return rmsnorm(u, p["backbone.norm_f.weight"], cfg["eps"]) @ head.t()


def loss_fn(p, cfg, tokens, checkpoint_layers=False, starts=()):
    """Mean over t = 0..T-2 of cross-entropy(logits_t, token_{t+1}). tokens: int64 (T,).
    starts: document starts the layers do not read across (the masked model)."""
    if tokens.numel() < 2:
        raise ValueError("need at least 2 tokens")
    if int(tokens.max()) >= cfg["V"] or int(tokens.min()) < 0:
        raise ValueError("token id out of range")
    u = p["backbone.embeddings.weight"][tokens]                  # (T, D)
    for k in range(cfg["K"]):
        if checkpoint_layers:
            import torch.utils.checkpoint as ckpt
            u = ckpt.checkpoint(lambda uu, kk=k: layer(uu, p, kk, cfg, starts), u,
                                use_reentrant=False)
        else:
            u = layer(u, p, k, cfg, starts)
    return F.cross_entropy(logits_fn(u, p, cfg)[:-1], tokens[1:])


def grads_params(cfg, params, tokens, dtype=torch.float64, checkpoint_layers=False, starts=()):
    """(loss float, OrderedDict name -> grad) by autograd, everything in `dtype`."""
    p = OrderedDict((k, v.detach().to(dtype).clone().requires_grad_(True)) for k, v in params.items())
    loss = loss_fn(p, cfg, tokens, checkpoint_layers, starts)
    gs = torch.autograd.grad(loss, list(p.values()))
    return loss.item(), OrderedDict((k, g.detach()) for k, g in zip(p.keys(), gs))


def _dtype(s):
    return {"f32": torch.float32, "f64": torch.float64}[s]


def grads(model_dir, tokens_path, dtype="f64"):
    """(loss, {name: grad}) of the model in model_dir on the token file, by autograd in dtype."""
    dt = _dtype(dtype) if isinstance(dtype, str) else dtype
    cfg, params = load_model(model_dir, dt)
    return grads_params(cfg, params, read_tokens(tokens_path), dt)


def loss_value(model_dir, tokens_path, dtype="f64"):
    dt = _dtype(dtype) if isinstance(dtype, str) else dtype
    cfg, params = load_model(model_dir, dt)
    with torch.no_grad():
        return loss_fn(params, cfg, read_tokens(tokens_path)).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grad", help="loss and gradient by autograd -> safetensors")
    g.add_argument("--model", required=True)
    g.add_argument("--tokens", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--dtype", choices=["f32", "f64"], default="f64")
    l = sub.add_parser("loss", help="print the loss")
    l.add_argument("--model", required=True)
    l.add_argument("--tokens", required=True)
    l.add_argument("--dtype", choices=["f32", "f64"], default="f64")
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if a.cmd == "grad":
        loss, gs = grads(a.model, a.tokens, a.dtype)
        out = OrderedDict(gs)
        out["loss"] = torch.tensor(loss, dtype=_dtype(a.dtype))
        save_safetensors(a.out, out)
        print(f"loss {loss:.17g}")
    else:
        print(f"{loss_value(a.model, a.tokens, a.dtype):.17g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
