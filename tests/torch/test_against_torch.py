#!/usr/bin/python3
"""Check `adjsh grad` against PyTorch autograd (tests/torch/mamba_ref.py).

Usage (run with /usr/bin/python3, which has torch):
  test_against_torch.py --adjsh build/cli/adjsh [--workdir DIR] [--basic] [--keep]
  test_against_torch.py                      # self-checks of the reference only (no adjsh)

Self-checks (always run; a wrong reference would make the comparison meaningless):
  * safetensors reader/writer round trip (F64, F32, BF16, scalar, __metadata__, known bit patterns);
  * the reference matches a literal transcription of Hugging Face's MambaMixer slow path
    (nn.Conv1d with padding W-1 truncated to T, [x; z] split of in_proj, [dt; B; C] split of
    x_proj, softplus(dt_proj(dt)) with bias, A = -exp(A_log), y = h C + D x', out_proj(y silu(z)),
    RMSNorm x rsqrt(mean x^2 + eps) w) in loss and every gradient, f64;
  * autograd gradient of the reference vs central finite differences of its f64 loss (sampled
    entries of every tensor, and one random direction through all parameters);
  * causality: changing token s leaves logits_t, t < s, unchanged;
  * torch f32 vs torch f64 stays well under the f32 tolerance (so the tolerance is attainable).

adjsh cases, for every config x chunk in {1, 7, T} x dtype in {f64, f32}:
  adjsh init --out DIR ... --dtype f64 ; adjsh grad --model DIR --tokens TOK --out G --dtype .. --chunk C
and every parameter gradient plus `loss` must be present, have the parameter's shape (loss: []),
be finite, and satisfy ||g_adjsh - g_ref|| / ||g_ref|| < 1e-9 (f64) or < 1e-4 (f32).
Contract extra (skip with --basic): `--window T` (window >= T must be exact), and the f32
gradient through 2 local worker processes (`--workers 2 --spans 3`, fewer for a T of fewer
chunks: the distributed path).
An untied LM head (tie_word_embeddings false, lm_head.weight), written in the HF layout by the
reference: f64 and f32 gradients, in-process and through 2 workers; `adjsh train` from it writes
a checkpoint that keeps lm_head.weight and loads here with the same loss (< 1e-12 relative).

The reference is always torch autograd in f64. For --dtype f32 we compare adjsh f32 against the
f64 reference, not against torch f32: the f64 result is the exact gradient to ~1e-14, so the
measured error is adjsh's own f32 error (rounding of the weights to f32 included, ~1e-7), rather
than the difference of two unrelated f32 rounding patterns. Torch f32 vs f64 is printed too, as the
yardstick of what a correct f32 implementation achieves.

Prints a per-tensor table (rel_l2 = ||a-b||/||b||, the pass criterion; rel_max = max|a-b|/max|b|)
per case, and `N passed, N failed` last; exits non-zero on any failure.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mamba_ref as ref  # noqa: E402

TOL = {"f64": 1e-9, "f32": 1e-4}

# Configs: D, K, N, W, E, R, V, T, seed, token file suffix
CONFIGS = [
    dict(D=8, K=2, N=4, W=4, E=2, R="auto", V=11, T=37, seed=1, ext=".u32"),
    dict(D=16, K=3, N=8, W=3, E=2, R=3, V=23, T=64, seed=2, ext=".u32"),
    # edge case: T < W (every conv window reaches before the start), E=3, uint16 tokens
    dict(D=12, K=1, N=3, W=4, E=3, R=2, V=7, T=3, seed=3, ext=".u16"),
]
CHUNKS = ["1", "7", "T"]


# ----------------------------------------------------------------------------------------------
# Literal transcription of Hugging Face transformers' MambaForCausalLM slow path (batch B = 1),
# used only to validate mamba_ref. Comments give the shapes HF uses: [batch, channels, seq_len].
# ----------------------------------------------------------------------------------------------
class HFRMSNorm(nn.Module):
    def __init__(self, D, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


class HFMixer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.intermediate_size, self.ssm_state_size, self.time_step_rank = c["Di"], c["N"], c["R"]
        self.conv1d = nn.Conv1d(c["Di"], c["Di"], bias=True, kernel_size=c["W"], groups=c["Di"],
                                padding=c["W"] - 1)
        self.in_proj = nn.Linear(c["D"], 2 * c["Di"], bias=False)
        self.x_proj = nn.Linear(c["Di"], c["R"] + 2 * c["N"], bias=False)
        self.dt_proj = nn.Linear(c["R"], c["Di"], bias=True)
        self.A_log = nn.Parameter(torch.zeros(c["Di"], c["N"]))
        self.D = nn.Parameter(torch.ones(c["Di"]))
        self.out_proj = nn.Linear(c["Di"], c["D"], bias=False)
        self.act = nn.SiLU()

    def forward(self, input_states):
        batch_size, seq_len, _ = input_states.shape
        dtype = input_states.dtype
        projected_states = self.in_proj(input_states).transpose(1, 2)  # [B, 2Di, T]
        hidden_states, gate = projected_states.chunk(2, dim=1)
        ssm_state = torch.zeros((batch_size, self.intermediate_size, self.ssm_state_size), dtype=dtype)
        hidden_states = self.act(self.conv1d(hidden_states)[..., :seq_len])  # [B, Di, T]
        ssm_parameters = self.x_proj(hidden_states.transpose(1, 2))
        time_step, B, C = torch.split(
            ssm_parameters, [self.time_step_rank, self.ssm_state_size, self.ssm_state_size], dim=-1)
        discrete_time_step = self.dt_proj(time_step)  # [B, T, Di]
        discrete_time_step = F.softplus(discrete_time_step).transpose(1, 2)  # [B, Di, T]
        A = -torch.exp(self.A_log)  # [Di, N]
        discrete_A = torch.exp(A[None, :, None, :] * discrete_time_step[:, :, :, None])  # [B,Di,T,N]
        discrete_B = discrete_time_step[:, :, :, None] * B[:, None, :, :]  # [B, Di, T, N]
        deltaB_u = discrete_B * hidden_states[:, :, :, None]
        scan_outputs = []
        for i in range(seq_len):
            ssm_state = discrete_A[:, :, i, :] * ssm_state + deltaB_u[:, :, i, :]  # [B, Di, N]
            scan_output = torch.matmul(ssm_state, C[:, i, :].unsqueeze(-1))  # [B, Di, 1]
            scan_outputs.append(scan_output[:, :, 0])
        scan_output = torch.stack(scan_outputs, dim=-1)  # [B, Di, T]
        scan_output = scan_output + (hidden_states * self.D[None, :, None])
        scan_output = scan_output * self.act(gate)
        return self.out_proj(scan_output.transpose(1, 2))  # [B, T, D]


class HFBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = HFRMSNorm(c["D"], c["eps"])
        self.mixer = HFMixer(c)

    def forward(self, hidden_states):
        residual = hidden_states
        return residual + self.mixer(self.norm(hidden_states))


class HFBackbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = nn.Embedding(c["V"], c["D"])
        self.layers = nn.ModuleList([HFBlock(c) for _ in range(c["K"])])
        self.norm_f = HFRMSNorm(c["D"], c["eps"])

    def forward(self, input_ids):
        hidden_states = self.embeddings(input_ids)
        for mixer_block in self.layers:
            hidden_states = mixer_block(hidden_states)
        return self.norm_f(hidden_states)


class HFMambaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.backbone = HFBackbone(c)

    def forward(self, input_ids, labels):
        hidden_states = self.backbone(input_ids)
        logits = F.linear(hidden_states, self.backbone.embeddings.weight)  # tied lm_head
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        return nn.CrossEntropyLoss()(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


def hf_grads(cfg, params, tokens, dtype):
    m = HFMambaForCausalLM(cfg).to(dtype)
    m.load_state_dict({k: v.to(dtype) for k, v in params.items()}, strict=True)  # names + shapes
    loss = m(tokens[None], tokens[None])
    loss.backward()
    named = dict(m.named_parameters())
    return loss.item(), OrderedDict((k, named[k].grad.detach()) for k in params)


# ----------------------------------------------------------------------------------------------
# comparison helpers
# ----------------------------------------------------------------------------------------------
def rel_l2(a, b):
    a, b = a.double(), b.double()
    nb = b.norm().item()
    d = (a - b).norm().item()
    return d / nb if nb > 0 else d


def rel_max(a, b):
    a, b = a.double(), b.double()
    mb = b.abs().max().item() if b.numel() else 0.0
    d = (a - b).abs().max().item() if b.numel() else 0.0
    return d / mb if mb > 0 else d


def compare(got, ref_loss, ref_grads, shapes, tol, label, extra_ref=None):
    """got: dict from the adjsh output; ref_grads: f64 reference. Prints a table; returns ok."""
    ok = True
    print(f"  {'tensor':<44} {'shape':<14} {'rel_l2':>10} {'rel_max':>10}"
          + (f" {'torch32':>10}" if extra_ref else "") + "  status")
    names = list(shapes.keys()) + ["loss"]
    worst = 0.0
    for name in names:
        want_shape = tuple(shapes[name]) if name != "loss" else ()
        r = ref_grads[name] if name != "loss" else torch.tensor(ref_loss, dtype=torch.float64)
        if name not in got:
            print(f"  {name:<44} {str(list(want_shape)):<14} {'':>10} {'':>10}  FAIL missing")
            ok = False
            continue
        g = got[name]
        if tuple(g.shape) != want_shape:
            print(f"  {name:<44} {str(list(g.shape)):<14} {'':>10} {'':>10}  FAIL shape, "
                  f"want {list(want_shape)}")
            ok = False
            continue
        g = g.to(torch.float64)
        if not torch.isfinite(g).all():
            print(f"  {name:<44} {str(list(want_shape)):<14} {'':>10} {'':>10}  FAIL non-finite")
            ok = False
            continue
        e2, em = rel_l2(g, r), rel_max(g, r)
        worst = max(worst, e2)
        good = e2 < tol
        ok &= good
        extra = ""
        if extra_ref is not None:
            x = extra_ref[name] if name != "loss" else torch.tensor(extra_ref["loss"])
            extra = f" {rel_l2(x, r):10.2e}"
        print(f"  {name:<44} {str(list(want_shape)):<14} {e2:10.2e} {em:10.2e}{extra}  "
              + ("ok" if good else f"FAIL > {tol:g}"))
    for name in got:
        if name not in shapes and name != "loss":
            print(f"  warning: unexpected tensor {name} in output")
    print(f"  {label}: worst rel_l2 {worst:.2e} (tol {tol:g}) -> {'PASS' if ok else 'FAIL'}")
    return ok


# ----------------------------------------------------------------------------------------------
# self-checks of the reference
# ----------------------------------------------------------------------------------------------
def _cfg_of(c):
    return ref.make_config(c["D"], c["K"], c["N"], c["W"], c["E"], c["R"], c["V"])


def _tokens(V, T, seed):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, V, size=T).astype(np.int64))


def check_safetensors(tmp):
    p = os.path.join(tmp, "rt.safetensors")
    g = torch.Generator().manual_seed(0)
    ts = OrderedDict([
        ("a.f64", torch.randn(3, 4, generator=g, dtype=torch.float64)),
        ("b.f32", torch.randn(5, generator=g)),
        ("c.bf16", torch.randn(2, 1, 3, generator=g).to(torch.bfloat16)),
        ("loss", torch.tensor(1.25, dtype=torch.float64)),
        ("empty", torch.zeros(0, 7)),
    ])
    ref.save_safetensors(p, ts, metadata={"format": "pt"})
    raw = open(p, "rb").read()
    hlen = int.from_bytes(raw[:8], "little")
    assert hlen % 8 == 0, "header not padded to 8 bytes"
    back = ref.load_safetensors(p)
    assert list(back.keys()) == list(ts.keys()), back.keys()
    for k in ts:
        assert back[k].dtype == ts[k].dtype and back[k].shape == ts[k].shape, k
        assert torch.equal(back[k].view(-1).float(), ts[k].view(-1).float()) or ts[k].numel() == 0, k
    assert back["loss"].shape == torch.Size([])
    # known bit patterns: bf16 1.0 = 0x3F80, -2.0 = 0xC000; f32 1.0 = 0x3F800000; hand-made file
    # with __metadata__ first and tensors listed out of offset order
    import json
    import struct
    hdr = {"__metadata__": {"x": "y"},
           "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
           "v": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}
    hb = json.dumps(hdr).encode()
    data = struct.pack("<HH", 0x3F80, 0xC000) + struct.pack("<I", 0x3F800000)
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + data)
    back = ref.load_safetensors(p)
    assert back["v"].float().tolist() == [1.0, -2.0], back["v"]
    assert back["w"].tolist() == [1.0]
    # token files
    for ext in (".u32", ".u16"):
        tp = os.path.join(tmp, "tok" + ext)
        ids = [0, 1, 65535, 7] if ext == ".u16" else [0, 1, 70000, 2 ** 32 - 1]
        ref.write_tokens(tp, ids)
        assert os.path.getsize(tp) == len(ids) * (4 if ext == ".u32" else 2)
        assert ref.read_tokens(tp).tolist() == ids
    print("  safetensors round trip, bit patterns, token files: ok")
    return True


def check_hf_semantics(tmp):
    ok = True
    for c in CONFIGS[:3]:
        cfg = _cfg_of(c)
        params = ref.init_params(cfg, seed=c["seed"] + 100)
        tok = _tokens(cfg["V"], max(c["T"], 2), c["seed"])
        l1, g1 = ref.grads_params(cfg, params, tok, torch.float64)
        l2, g2 = hf_grads(cfg, params, tok, torch.float64)
        worst = max(rel_l2(g1[k], g2[k]) for k in g1)
        dl = abs(l1 - l2) / abs(l2)
        good = worst < 1e-12 and dl < 1e-13
        ok &= good
        print(f"  HF slow path vs mamba_ref  D={c['D']} K={c['K']} N={c['N']} W={c['W']} E={c['E']} "
              f"R={cfg['R']} T={c['T']}: loss rel {dl:.1e}, worst grad rel_l2 {worst:.1e} "
              + ("ok" if good else "FAIL"))
    return ok


def check_finite_differences(tmp):
    c = CONFIGS[0]
    cfg = _cfg_of(c)
    params = ref.init_params(cfg, seed=7)
    tok = _tokens(cfg["V"], c["T"], 11)
    _, g = ref.grads_params(cfg, params, tok, torch.float64)

    def L(p):
        with torch.no_grad():
            return ref.loss_fn(p, cfg, tok).item()

    h = 1e-5
    rng = np.random.default_rng(3)
    ok = True
    fd_all, ag_all = [], []
    for name, t in params.items():
        n = t.numel()
        idx = sorted(set([0, n - 1] + rng.integers(0, n, size=min(n, 6)).tolist()))
        fds, ags = [], []
        for i in idx:
            pp = OrderedDict(params)
            tp, tm = t.clone().view(-1), t.clone().view(-1)
            tp[i] += h
            tm[i] -= h
            pp[name] = tp.view(t.shape)
            lp = L(pp)
            pp[name] = tm.view(t.shape)
            lm = L(pp)
            fds.append((lp - lm) / (2 * h))
            ags.append(g[name].view(-1)[i].item())
        fd_all += fds
        ag_all += ags
        fds, ags = torch.tensor(fds), torch.tensor(ags)
        err = (fds - ags).abs().max().item()
        scale = max(ags.abs().max().item(), 1e-3)
        if err / scale > 1e-6:
            ok = False
            print(f"  FD {name}: max err {err:.2e} (scale {scale:.2e}) FAIL")
    e = rel_l2(torch.tensor(fd_all), torch.tensor(ag_all))
    ok &= e < 1e-7
    print(f"  finite differences (h={h:g}, {len(fd_all)} sampled entries over {len(params)} tensors): "
          f"rel_l2 {e:.2e} " + ("ok" if e < 1e-7 else "FAIL"))
    # one random direction through all parameters at once
    gen = torch.Generator().manual_seed(5)
    v = OrderedDict((k, torch.randn(t.shape, generator=gen, dtype=torch.float64)) for k, t in params.items())
    dd = sum((g[k] * v[k]).sum().item() for k in params)
    hp = OrderedDict((k, params[k] + h * v[k]) for k in params)
    hm = OrderedDict((k, params[k] - h * v[k]) for k in params)
    fd = (L(hp) - L(hm)) / (2 * h)
    de = abs(fd - dd) / abs(dd)
    ok &= de < 1e-7
    print(f"  directional derivative: autograd {dd:.12e} FD {fd:.12e} rel {de:.1e} "
          + ("ok" if de < 1e-7 else "FAIL"))
    return ok


def check_causality(tmp):
    c = CONFIGS[1]
    cfg = _cfg_of(c)
    p = ref.init_params(cfg, seed=9)
    tok = _tokens(cfg["V"], 20, 4)
    s = 12
    tok2 = tok.clone()
    tok2[s] = (tok2[s] + 1) % cfg["V"]

    def logits(tk):
        with torch.no_grad():
            u = p["backbone.embeddings.weight"][tk]
            for k in range(cfg["K"]):
                u = ref.layer(u, p, k, cfg)
            return ref.logits_fn(u, p, cfg)

    a, b = logits(tok), logits(tok2)
    before = (a[:s] - b[:s]).abs().max().item()
    after = (a[s:] - b[s:]).abs().max(-1).values
    good = before == 0.0 and bool((after > 0).all())
    print(f"  causality: max |dlogits| before s {before:.1e}, all later positions change: "
          f"{bool((after > 0).all())} " + ("ok" if good else "FAIL"))
    return good


def check_f32_headroom(tmp):
    ok = True
    for c in CONFIGS[:2]:
        cfg = _cfg_of(c)
        params = ref.init_params(cfg, seed=c["seed"])
        tok = _tokens(cfg["V"], c["T"], c["seed"])
        l64, g64 = ref.grads_params(cfg, params, tok, torch.float64)
        l32, g32 = ref.grads_params(cfg, params, tok, torch.float32)
        worst = max(rel_l2(g32[k], g64[k]) for k in g64)
        good = worst < TOL["f32"] / 10
        ok &= good
        print(f"  torch f32 vs f64, D={c['D']} T={c['T']}: worst rel_l2 {worst:.1e}, loss rel "
              f"{abs(l32 - l64) / l64:.1e} (want < {TOL['f32'] / 10:g}) " + ("ok" if good else "FAIL"))
    return ok


SELF_CHECKS = [
    ("self: safetensors + token files", check_safetensors),
    ("self: reference == HF MambaMixer slow path", check_hf_semantics),
    ("self: autograd == finite differences", check_finite_differences),
    ("self: causality", check_causality),
    ("self: f32 tolerance attainable", check_f32_headroom),
]


# ----------------------------------------------------------------------------------------------
# adjsh cases
# ----------------------------------------------------------------------------------------------
def run(cmd, timeout):
    print("  $ " + " ".join(cmd))
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0:
        print("    " + "\n    ".join(out.strip().splitlines()[-30:]))
        raise RuntimeError(f"exit status {r.returncode}")
    print(f"    ({time.time() - t0:.2f} s)")
    return out


def adjsh_cases(args, tmp, record):
    for ci, c in enumerate(CONFIGS):
        cname = (f"D={c['D']} K={c['K']} N={c['N']} W={c['W']} E={c['E']} R={c['R']} V={c['V']} "
                 f"T={c['T']}")
        mdir = os.path.join(tmp, f"model{ci}")
        tpath = os.path.join(tmp, f"tokens{ci}{c['ext']}")
        print(f"\n== config {ci}: {cname}")
        try:
            run([args.adjsh, "init", "--out", mdir, "--hidden-size", str(c["D"]), "--layers", str(c["K"]),
                 "--state-size", str(c["N"]), "--conv-kernel", str(c["W"]), "--expand", str(c["E"]),
                 "--dt-rank", str(c["R"]), "--vocab-size", str(c["V"]), "--seed", str(c["seed"]),
                 "--dtype", "f64"], args.timeout)
            cfg, params = ref.load_model(mdir, torch.float64)  # checks names and shapes
            want = _cfg_of(c)
            for key in ("D", "K", "N", "W", "E", "Di", "R", "V"):
                if cfg[key] != want[key]:
                    raise ValueError(f"config.json {key}={cfg[key]}, expected {want[key]}")
            ref.write_tokens(tpath, _tokens(c["V"], c["T"], 1000 + ci).tolist())
            tok = ref.read_tokens(tpath)
            l64, g64 = ref.grads_params(cfg, params, tok, torch.float64)
            l32, g32 = ref.grads_params(cfg, params, tok, torch.float32)
            g32 = dict(g32, loss=l32)
            print(f"  torch loss f64 {l64:.17g}, f32 {l32:.9g}")
        except Exception as e:  # noqa: BLE001
            print(f"  FAIL setting up config {ci}: {e}")
            record(f"config {ci} init", False)
            continue
        shapes = ref.param_shapes(cfg)
        cases = [(ch, dt, []) for ch in CHUNKS for dt in ("f64", "f32")]
        if not args.basic:
            cases += [("7", "f64", ["--window", str(c["T"])]),
                      # the span schedule through 2 local worker processes, up to 3 spans
                      ("7", "f32", ["--workers", "2", "--spans",
                                    str(min(3, (c["T"] + 6) // 7))])]
        for ch, dt, extra in cases:
            C = str(c["T"]) if ch == "T" else ch
            label = f"config {ci} chunk {C} {dt}" + (" " + " ".join(extra) if extra else "")
            print(f"\n-- {label}")
            out = os.path.join(tmp, f"g{ci}_{C}_{dt}{'_'.join([''] + extra).replace('-', '')}.safetensors")
            try:
                if os.path.exists(out):
                    os.remove(out)
                run([args.adjsh, "grad", "--model", mdir, "--tokens", tpath, "--out", out,
                     "--dtype", dt, "--chunk", C] + extra, args.timeout)
                got = ref.load_safetensors(out)
                ok = compare(got, l64, g64, shapes, TOL[dt], label, extra_ref=g32 if dt == "f32" else None)
            except Exception as e:  # noqa: BLE001
                print(f"  FAIL {label}: {e}")
                ok = False
            record(label, ok)


def untied_head_cases(args, tmp, record):
    """An untied LM head (tie_word_embeddings false, lm_head.weight): a model written in the HF
    layout by the reference, its gradient from adjsh in f64 and f32, in-process and through 2
    workers, against autograd (lm_head.weight's gradient its own, the embedding's the lookups'
    alone); and a checkpoint `adjsh train` writes from it keeps the untied head and loads here
    with the same loss."""
    cfg = ref.make_config(8, 2, 4, 4, 2, "auto", 11, tied=False)
    mdir = os.path.join(tmp, "untied")
    tpath = os.path.join(tmp, "untied_tokens.u32")
    params = ref.init_params(cfg, seed=5)
    ref.save_model(mdir, cfg, params)
    tok = _tokens(cfg["V"], 61, 2024)
    ref.write_tokens(tpath, tok.tolist())
    l64, g64 = ref.grads_params(cfg, params, tok, torch.float64)
    l32, g32 = ref.grads_params(cfg, params, tok, torch.float32)
    shapes = ref.param_shapes(cfg)
    tied = ref.grads_params(dict(cfg, tied=True),
                            OrderedDict((k, v) for k, v in params.items() if k != "lm_head.weight"),
                            tok, torch.float64)[1]
    print(f"\n== untied LM head: torch loss f64 {l64:.17g}; embedding gradient against the tied "
          f"model's: rel_l2 {rel_l2(g64['backbone.embeddings.weight'], tied['backbone.embeddings.weight']):.2e}")
    for C, dt, extra in (("7", "f64", []), ("61", "f32", []),
                         ("7", "f32", ["--workers", "2", "--spans", "3"])):
        label = f"untied head chunk {C} {dt}" + (" " + " ".join(extra) if extra else "")
        print(f"\n-- {label}")
        out = os.path.join(tmp, f"untied_{C}_{dt}_{len(extra)}.safetensors")
        try:
            run([args.adjsh, "grad", "--model", mdir, "--tokens", tpath, "--out", out, "--dtype",
                 dt, "--chunk", C] + extra, args.timeout)
            ok = compare(ref.load_safetensors(out), l64, g64, shapes, TOL[dt], label,
                         extra_ref=dict(g32, loss=l32) if dt == "f32" else None)
        except Exception as e:  # noqa: BLE001
            print(f"  FAIL {label}: {e}")
            ok = False
        record(label, ok)
    label = "untied head: adjsh train's checkpoint keeps lm_head.weight, same loss in PyTorch"
    print(f"\n-- {label}")
    try:
        ck = os.path.join(tmp, "untied_ckpt")
        run([args.adjsh, "train", "--model", mdir, "--tokens", tpath, "--context", "61",
             "--chunk", "16", "--steps", "3", "--checkpoint-dir", ck], args.timeout)
        with open(os.path.join(ck, "latest")) as f:
            trained = os.path.join(ck, f.read().strip())
        tcfg, tparams = ref.load_model(trained, torch.float64)  # names and shapes, lm_head too
        moved = (tparams["lm_head.weight"] - params["lm_head.weight"]).abs().max().item()
        out = os.path.join(tmp, "untied_ck_grad.safetensors")
        run([args.adjsh, "grad", "--model", trained, "--tokens", tpath, "--out", out, "--dtype",
             "f64"], args.timeout)
        ours = float(ref.load_safetensors(out)["loss"].item())
        theirs = ref.loss_value(trained, tpath, "f64")
        print(f"  tied {tcfg['tied']}, lm_head moved by {moved:.2e}; adjsh {ours:.15g}  "
              f"torch {theirs:.15g}")
        ok = not tcfg["tied"] and moved > 0 and abs(ours - theirs) <= 1e-12 * abs(theirs)
    except Exception as e:  # noqa: BLE001
        print(f"  FAIL {label}: {e}")
        ok = False
    record(label, ok)


def checkpoint_case(args, tmp, record):
    """A checkpoint written by `adjsh train` loads in the PyTorch model with the same loss."""
    label = "adjsh train checkpoint loads in PyTorch with the same loss"
    print(f"\n-- {label}")
    try:
        ck = os.path.join(tmp, "train_ckpt")
        run([args.adjsh, "train", "--hidden-size", "16", "--layers", "2", "--state-size", "4",
             "--context", "300", "--steps", "4", "--chunk", "64", "--checkpoint-dir", ck],
            args.timeout)
        with open(os.path.join(ck, "latest")) as f:
            mdir = os.path.join(ck, f.read().strip())
        tpath = os.path.join(tmp, "ck_tokens.u16")
        ref.write_tokens(tpath, _tokens(256, 200, 77).tolist())
        out = os.path.join(tmp, "ck_grad.safetensors")
        run([args.adjsh, "grad", "--model", mdir, "--tokens", tpath, "--out", out, "--dtype", "f64"],
            args.timeout)
        ours = float(ref.load_safetensors(out)["loss"].item())
        theirs = ref.loss_value(mdir, tpath, "f64")
        print(f"  adjsh {ours:.15g}  torch {theirs:.15g}")
        ok = abs(ours - theirs) <= 1e-12 * abs(theirs)
    except Exception as e:  # noqa: BLE001
        print(f"  FAIL {label}: {e}")
        ok = False
    record(label, ok)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adjsh", help="path of the adjsh binary; without it only the self-checks run")
    ap.add_argument("--workdir", help="temp dir for models/tokens/outputs (default: a new one)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--basic", action="store_true", help="skip the --window case")
    ap.add_argument("--no-self", action="store_true", help="skip the self-checks")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per adjsh call")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

    own = args.workdir is None
    tmp = tempfile.mkdtemp(prefix="adjsh_torch_") if own else args.workdir
    os.makedirs(tmp, exist_ok=True)
    results = []

    def record(name, ok):
        results.append((name, bool(ok)))

    if not args.no_self:
        print("== self-checks of the PyTorch reference")
        for name, fn in SELF_CHECKS:
            try:
                ok = fn(tmp)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                ok = False
            record(name, ok)

    if args.adjsh:
        if not (os.path.isfile(args.adjsh) and os.access(args.adjsh, os.X_OK)):
            print(f"FAIL: adjsh binary {args.adjsh} not found or not executable")
            record("adjsh binary present", False)
        else:
            args.adjsh = os.path.abspath(args.adjsh)
            adjsh_cases(args, tmp, record)
            untied_head_cases(args, tmp, record)
            checkpoint_case(args, tmp, record)
    else:
        print("\n(no --adjsh given: only the self-checks ran)")

    npass = sum(ok for _, ok in results)
    nfail = len(results) - npass
    print("\n== summary")
    for name, ok in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    if own and not args.keep and nfail == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    elif nfail:
        print(f"  files kept in {tmp}")
    print(f"{npass} passed, {nfail} failed")
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
