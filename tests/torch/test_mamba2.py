"""Mamba-2 (model_type "mamba2"): adjsh grad's exact gradient against the PyTorch reference
(tests/torch/mamba2_ref.py), which is checked first against finite differences and, on one
chunk, against transformers' own Mamba2ForCausalLM (the file layout).

  .venv/bin/python tests/torch/test_mamba2.py --adjsh build/cli/adjsh [--quick]

Checks:
  * the reference's gradient against central differences along random directions (every
    parameter at once, unit normal steps): the error falls as h^2, about 100x from h = 1e-3
    to 1e-4, where it is below 1e-3 (the curvature term; an error in the gradient would
    stay);
  * transformers 4.44 (G = 1, T inside one of its chunks, dt above its time_step_min clamp, in
    f64) gives the reference's loss: the names, shapes and config keys are HF's;
  * every parameter's gradient and the loss from `adjsh grad` equal the reference's:
    relative L2 < 1e-9 in f64 and < 1e-4 in f32 (f32 rounding over T = 300 tokens of sums of
    a few hundred terms: ~1e-6 expected; a tensor whose gradient cancels to a small sum, where
    torch's own f32 errs above 1e-5, within 10x of torch's f32 error), over G in {1, 2},
    head_dim in {4, 16}, tied and untied heads, a clamped time_step_limit, T in {2, 97, 300}
    and chunk in {1, 7, 64, T};
  * the span schedule: --spans 1, 2, 5, 43 (chunk 7), 3 (chunk 100) and 150 (chunk 1: spans of
    W - 1 tokens, the shortest the conv halo allows) give the reference's gradient (< 1e-9 in
    f64), and the same bytes on 1, 2 and 3 threads;
  * --workers 1, 2, 3 (local CPU worker processes): the in-process run's bytes, full and bf16;
  * --storage bf16: the exact gradient of the model that rounds each layer's input to bf16
    (< 1e-9 in f64, < 1e-3 in f32); --spill-dir gives the same bytes;
  * `adjsh eval` (forward only, chunk by chunk) gives the reference's loss to < 1e-12 in f64,
    the file as one sequence and in sequences of --context, at chunks 1, 7 and 256;
  * `adjsh generate` decodes recurrently: greedy, the reference's argmax tokens; sampled, the
    same seed gives the same tokens;
  * a config.json written by Python's json (time_step_limit [0.0, Infinity]) is read;
  * bad input exits 1 naming the problem and writes nothing: num_heads x head_dim != expand x
    hidden_size, n_groups not dividing num_heads, a missing tensor, a misshapen one, a NaN in
    one; a flag a Mamba-2 gradient does not take (--workers with f64, --schedule) is bad usage
    (exit 2). The devices are tests/cli/test_device.py's.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mamba2_ref as ref  # noqa: E402
import mamba_ref as m1  # noqa: E402

FAILS = []


def check(label, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + label + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        FAILS.append(label)


def rel_l2(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    nb = b.norm().item()
    return (a - b).norm().item() / nb if nb > 0 else (a - b).norm().item()


def tokens(V, T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (T,), generator=g).tolist()


def check_reference():
    cfg = ref.make_config(D=8, K=2, N=4, W=4, E=2, P=4, G=2, V=13)
    p = ref.init_params(cfg, seed=1)
    tok = tokens(13, 24, 3)
    _, g = ref.grads_params(cfg, p, tok)
    errs = []
    for seed in (5, 6):
        gen = torch.Generator().manual_seed(seed)
        d = {n: torch.randn(v.shape, generator=gen, dtype=torch.float64) for n, v in p.items()}
        an = sum(float((g[n] * d[n]).sum()) for n in p)

        def loss_at(e):
            return float(ref.loss_fn({n: p[n] + e * d[n] for n in p}, cfg, torch.tensor(tok)))

        for h in (1e-3, 1e-4):
            fd = (loss_at(h) - loss_at(-h)) / (2 * h)
            errs.append(abs(fd - an) / abs(an))
    ratios = [errs[0] / errs[1], errs[2] / errs[3]]
    check(f"reference = finite differences (rel err {errs[1]:.1e}, {errs[3]:.1e} at h = 1e-4; "
          f"falls {ratios[0]:.0f}x, {ratios[1]:.0f}x from h = 1e-3)",
          errs[1] < 1e-3 and errs[3] < 1e-3 and all(50 < r < 200 for r in ratios), errs)


def check_transformers(tmp):
    try:
        from transformers import Mamba2ForCausalLM
    except ImportError as e:
        check("transformers Mamba2ForCausalLM importable", False, e)
        return
    cfg = ref.make_config(D=8, K=2, N=4, W=4, E=2, P=4, G=1, V=13, chunk_size=64)
    p = ref.init_params(cfg, seed=2)
    for k in range(cfg["num_hidden_layers"]):  # dt above transformers' clamp at time_step_min
        b = f"backbone.layers.{k}.mixer.dt_bias"
        dt = 0.01 + 0.05 * torch.rand(p[b].shape, generator=torch.Generator().manual_seed(k))
        p[b] = dt + torch.log(-torch.expm1(-dt))
    d = os.path.join(tmp, "hf")
    ref.save_model(d, cfg, p)
    tok = tokens(13, 40, 4)
    want, _ = ref.grads_params(cfg, p, tok)
    m = Mamba2ForCausalLM.from_pretrained(d).to(torch.float64)
    got = float(m(torch.tensor([tok]), labels=torch.tensor([tok])).loss)
    # transformers computes parts of its Mamba2 in f32 whatever the model's dtype.
    check(f"transformers Mamba2ForCausalLM loads the layout: loss {got:.9f} = reference "
          f"{want:.9f} (f32 rounding)", abs(got - want) / want < 1e-5, (got, want))


def run(adjsh, args, timeout=300):
    return subprocess.run([adjsh] + args, capture_output=True, text=True, timeout=timeout)


CONFIGS = [  # (label, make_config kwargs)
    ("G=1 P=4 tied", dict(D=8, K=2, N=4, W=4, E=2, P=4, G=1, V=13)),
    ("G=2 P=4 untied", dict(D=8, K=2, N=3, W=3, E=2, P=4, G=2, V=11, tied=False)),
    ("G=2 P=16 tied", dict(D=16, K=2, N=4, W=4, E=2, P=16, G=2, V=13)),
    ("G=1 P=16 untied, dt clamped to [0.01, 0.05]",
     dict(D=16, K=1, N=5, W=4, E=1, P=16, G=1, V=9, tied=False, limit=(0.01, 0.05))),
]


def check_gradients(adjsh, tmp, quick):
    lengths = (2, 97) if quick else (2, 97, 300)
    for ci, (label, kw) in enumerate(CONFIGS):
        cfg = ref.make_config(**kw)
        params = ref.init_params(cfg, seed=10 + ci)
        mdir = os.path.join(tmp, f"m{ci}")
        ref.save_model(mdir, cfg, params)
        for T in lengths:
            tpath = os.path.join(tmp, f"t{ci}_{T}.u32")
            tok = tokens(cfg["vocab_size"], T, 100 * ci + T)
            m1.write_tokens(tpath, tok)
            l64, g64 = ref.grads_params(cfg, params, tok)
            # f32: 1e-4, or 10x torch's own f32 error on a tensor whose sum cancels (a small
            # gradient of many terms of both signs, e.g. D's at T = 2: torch f32 errs 5e-5).
            _, g32 = ref.grads_params(cfg, {n: v.float() for n, v in params.items()}, tok,
                                      torch.float32)
            tol32 = {n: max(1e-4, 10 * rel_l2(g32[n], v)) for n, v in g64.items()}
            for chunk in sorted({1, 7, 64, T}):
                for dt in ("f64", "f32"):
                    out = os.path.join(tmp, f"g{ci}_{T}_{chunk}_{dt}.safetensors")
                    r = run(adjsh, ["grad", "--model", mdir, "--tokens", tpath, "--out", out,
                                    "--chunk", str(chunk), "--dtype", dt, "--quiet"])
                    name = f"{label} T={T} chunk {chunk} {dt}"
                    if r.returncode != 0:
                        check(name, False, r.stderr[-400:])
                        continue
                    got = m1.load_safetensors(out)
                    tol = (lambda n: 1e-9) if dt == "f64" else (lambda n: tol32.get(n, 1e-4))
                    worst, where = abs(float(got.pop("loss")) - l64) / abs(l64), "loss"
                    ok = worst < tol("loss")
                    if set(got) != set(g64):
                        check(name, False, f"tensors {sorted(set(got) ^ set(g64))}")
                        continue
                    for n, v in g64.items():
                        e = rel_l2(got[n], v)
                        ok &= e < tol(n)
                        if e > worst:
                            worst, where = e, n
                    check(f"{name}: worst relative L2 {worst:.1e} ({where}, bound "
                          f"{tol(where):.0e})", ok, worst)


def test_model(tmp, name, seed, T, token_seed):
    """CONFIGS[1]'s model with seed, saved as tmp/name, and T tokens written beside it:
    (label, cfg, params, model dir, tokens, token file)."""
    label, kw = CONFIGS[1]
    cfg = ref.make_config(**kw)
    params = ref.init_params(cfg, seed=seed)
    mdir = os.path.join(tmp, name)
    ref.save_model(mdir, cfg, params)
    tok = tokens(cfg["vocab_size"], T, token_seed)
    tpath = os.path.join(tmp, f"{name}.u32")
    m1.write_tokens(tpath, tok)
    return label, cfg, params, mdir, tok, tpath


def check_spans(adjsh, tmp):
    """The span schedule (engine/span_math.h): every span count gives the reference's
    gradient (< 1e-9 in f64), and the same bytes on 1, 2 and 3 threads (f32, 3 runs each)."""
    T = 300
    label, cfg, params, mdir, tok, tpath = test_model(tmp, "m-spans", 12, T, 9)
    l64, g64 = ref.grads_params(cfg, params, tok)
    for spans, chunk in ((1, 7), (2, 7), (5, 7), (43, 7), (3, 100), (150, 1)):
        out = os.path.join(tmp, f"g-spans-{spans}.safetensors")
        r = run(adjsh, ["grad", "--model", mdir, "--tokens", tpath, "--out", out, "--chunk",
                        str(chunk), "--spans", str(spans), "--dtype", "f64", "--quiet"])
        if r.returncode != 0:
            check(f"--spans {spans}", False, r.stderr[-400:])
            continue
        got = m1.load_safetensors(out)
        loss = abs(float(got.pop("loss")) - l64) / abs(l64)
        worst, where = max((rel_l2(got[n], v), n) for n, v in g64.items())
        check(f"{label} T={T} chunk {chunk} --spans {spans} f64: worst relative L2 {worst:.1e} "
              f"({where}), loss {loss:.1e} (bound 1e-9)", max(worst, loss) < 1e-9, worst)
    outs = set()
    for threads in (1, 2, 3):
        for rep in range(3):
            out = os.path.join(tmp, f"g-threads-{threads}-{rep}.safetensors")
            r = run(adjsh, ["grad", "--model", mdir, "--tokens", tpath, "--out", out, "--chunk",
                            "7", "--spans", "5", "--threads", str(threads), "--quiet"])
            outs.add(open(out, "rb").read() if r.returncode == 0 else r.stderr)
    check("--spans 5 in f32: the same bytes on 1, 2 and 3 threads, 3 runs each", len(outs) == 1,
          len(outs))


def check_workers(adjsh, tmp):
    """--workers N (local CPU worker processes, the span tasks of engine/span_math.h
    through the coordinator): the reference's gradient in f32 (< 1e-4), and bitwise the
    in-process run on threads for 1, 2 and 3 workers, in full and in bf16 storage."""
    T = 300
    label, cfg, params, mdir, tok, tpath = test_model(tmp, "m-workers", 12, T, 11)
    _, g64 = ref.grads_params(cfg, params, tok)
    for storage in ("full", "bf16"):
        base = ["grad", "--model", mdir, "--tokens", tpath, "--chunk", "7", "--spans", "6",
                "--storage", storage, "--quiet"]
        want = os.path.join(tmp, f"g-w0-{storage}.safetensors")
        r = run(adjsh, base + ["--out", want, "--threads", "2"])
        if r.returncode != 0:
            check(f"in-process --storage {storage}", False, r.stderr[-400:])
            continue
        if storage == "full":
            got = m1.load_safetensors(want)
            got.pop("loss")
            worst, where = max((rel_l2(got[n], v), n) for n, v in g64.items())
            check(f"{label} T={T} chunk 7 --spans 6 f32: worst relative L2 {worst:.1e} ({where})"
                  " (bound 1e-4)", worst < 1e-4, worst)
        for workers in (1, 2, 3):
            out = os.path.join(tmp, f"g-w{workers}-{storage}.safetensors")
            r = run(adjsh, base + ["--out", out, "--workers", str(workers)])
            same = r.returncode == 0 and open(out, "rb").read() == open(want, "rb").read()
            check(f"--workers {workers} --storage {storage}: the in-process run's bytes", same,
                  r.stderr[-400:])


def check_storage(adjsh, tmp):
    """--storage bf16: the exact gradient of the model that rounds each layer's input to bf16
    (the reference with round_inputs_bf16, in f64): < 1e-9 in f64; < 1e-3 in f32 (f32's own
    rounding, ~1e-6, and a stored value whose f32 and f64 forwards round to neighbouring
    bf16 numbers: 2^-8 relative in one element). How far that is from the unrounded model's
    gradient is printed (bf16's 2^-9 per stored value, more on a gradient that cancels). A
    spill directory gives the same bytes as memory."""
    T = 97
    label, cfg, params, mdir, tok, tpath = test_model(tmp, "m-storage", 11, T, 5)
    _, plain = ref.grads_params(cfg, params, tok)
    _, rounded = ref.grads_params(dict(cfg, round_inputs_bf16=True), params, tok)
    spill = os.path.join(tmp, "spill")
    os.makedirs(spill, exist_ok=True)
    outs = {}
    for dt, bound in (("f64", 1e-9), ("f32", 1e-3)):
        for chunk in (7, T):
            out = os.path.join(tmp, f"g-bf16-{dt}-{chunk}.safetensors")
            r = run(adjsh, ["grad", "--model", mdir, "--tokens", tpath, "--out", out, "--chunk",
                            str(chunk), "--dtype", dt, "--storage", "bf16", "--quiet"])
            if r.returncode != 0:
                check(f"--storage bf16 {dt} chunk {chunk}", False, r.stderr[-400:])
                continue
            got = m1.load_safetensors(out)
            got.pop("loss")
            worst, where = max((rel_l2(got[n], v), n) for n, v in rounded.items())
            off, off_at = max((rel_l2(got[n], v), n) for n, v in plain.items())
            check(f"{label} T={T} chunk {chunk} {dt} --storage bf16: worst relative L2 "
                  f"{worst:.1e} ({where}) against the rounding model's gradient (bound "
                  f"{bound:.0e}); {off:.1e} ({off_at}) from the unrounded model's",
                  worst < bound, worst)
            outs[(dt, chunk)] = out
    out = os.path.join(tmp, "g-bf16-spill.safetensors")
    r = run(adjsh, ["grad", "--model", mdir, "--tokens", tpath, "--out", out, "--chunk", "7",
                    "--dtype", "f64", "--storage", "bf16", "--spill-dir", spill, "--quiet"])
    same = (r.returncode == 0 and ("f64", 7) in outs
            and open(out, "rb").read() == open(outs[("f64", 7)], "rb").read())
    check("--spill-dir: the same bytes as in memory", same, r.stderr[-400:])


def check_eval(adjsh, tmp):
    """adjsh eval (forward only, chunk by chunk) gives the reference's loss, for the whole file
    as one sequence and cut into sequences of --context."""
    cfg = ref.make_config(**CONFIGS[1][1])
    params = ref.init_params(cfg, seed=21)
    mdir = os.path.join(tmp, "eval_model")
    ref.save_model(mdir, cfg, params)
    T, ctx = 250, 97
    tok = tokens(cfg["vocab_size"], T, 77)
    tpath = os.path.join(tmp, "eval.u32")
    m1.write_tokens(tpath, tok)
    whole, _ = ref.grads_params(cfg, params, tok)
    parts = [tok[s:s + ctx] for s in range(0, T, ctx)]
    cut = sum(ref.grads_params(cfg, params, p)[0] * (len(p) - 1) for p in parts) / (T - len(parts))
    for context, want in ((0, whole), (ctx, cut)):
        for chunk in (1, 7, 256):
            r = run(adjsh, ["eval", "--model", mdir, "--tokens", tpath, "--dtype", "f64",
                            "--chunk", str(chunk), "--context", str(context), "--quiet"])
            words = r.stdout.split()
            ok = r.returncode == 0 and len(words) == 6 and words[0] == "loss" and words[4] == "tokens"
            got = float(words[1]) if ok else float("nan")
            check(f"adjsh eval context {context} chunk {chunk}: loss {got:.15f} = reference "
                  f"{want:.15f} (< 1e-12 relative)",
                  ok and abs(got - want) <= 1e-12 * abs(want) and words[5] == str(T),
                  (r.returncode, r.stdout, r.stderr[-300:]))


def check_generate(adjsh, tmp):
    """adjsh generate decodes recurrently: greedy, it gives the reference's argmax tokens (a full
    forward per step); sampled, a seed fixes the tokens."""
    cfg = ref.make_config(**CONFIGS[0][1])
    params = ref.init_params(cfg, seed=31)
    mdir = os.path.join(tmp, "gen_model")
    ref.save_model(mdir, cfg, params)
    prompt = tokens(cfg["vocab_size"], 20, 5)
    ppath = os.path.join(tmp, "prompt.u32")
    m1.write_tokens(ppath, prompt)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            seq.append(int(ref.logits_fn(params, cfg, torch.tensor(seq))[-1].argmax()))
    want = seq[len(prompt):]

    def gen(*extra):
        r = run(adjsh, ["generate", "--model", mdir, "--prompt-tokens", ppath,
                        "--max-new-tokens", "12", "--quiet"] + list(extra))
        return r.returncode, [int(w) for w in r.stdout.split()], r.stderr

    rc, got, err = gen("--temperature", "0")
    check(f"adjsh generate greedy = the reference's argmax tokens ({got})", rc == 0 and got == want,
          (want, err[-300:]))
    a, b, c = gen("--seed", "3"), gen("--seed", "3"), gen("--seed", "4")
    check("adjsh generate: the same seed, the same tokens; another seed, others",
          a[0] == 0 and a[1] == b[1] and len(a[1]) == 12 and a[1] != c[1], (a, b, c))


def check_bad_input(adjsh, tmp):
    cfg = ref.make_config(D=8, K=1, N=4, W=4, E=2, P=4, G=2, V=13)
    params = ref.init_params(cfg, seed=3)
    tpath = os.path.join(tmp, "bad.u32")
    m1.write_tokens(tpath, tokens(13, 10, 9))

    def refused(label, mdir, want, extra=(), code=1):
        out = os.path.join(tmp, "bad_out.safetensors")
        if os.path.exists(out):
            os.remove(out)
        r = run(adjsh, ["grad", "--model", mdir, "--tokens", tpath, "--out", out] + list(extra))
        check(f"{label}: exit {code} naming '{want}', nothing written",
              r.returncode == code and want in r.stderr and not os.path.exists(out),
              (r.returncode, r.stderr[-300:]))

    def variant(name, edit_cfg=None, edit_params=None):
        c = dict(cfg)
        p = dict(params)
        if edit_cfg:
            edit_cfg(c)
        if edit_params:
            edit_params(p)
        d = os.path.join(tmp, name)
        ref.save_model(d, c, p)
        return d

    refused("num_heads x head_dim != expand x hidden_size",
            variant("heads", lambda c: c.update(num_heads=3)), "num_heads x head_dim")
    refused("n_groups not dividing num_heads",
            variant("groups", lambda c: c.update(n_groups=3)), "does not divide num_heads")
    refused("a missing tensor", variant("missing", edit_params=lambda p: p.pop(
        "backbone.layers.0.mixer.dt_bias")), "missing tensor \"backbone.layers.0.mixer.dt_bias\"")
    refused("a misshapen tensor", variant("shape", edit_params=lambda p: p.update({
        "backbone.layers.0.mixer.A_log": torch.zeros(5, dtype=torch.float64)})),
        "backbone.layers.0.mixer.A_log\" has shape (5)")
    refused("a NaN in a tensor", variant("nan", edit_params=lambda p: p.update({
        "backbone.layers.0.mixer.D": torch.full((4,), float("nan"), dtype=torch.float64)})),
        "non-finite value")
    good = variant("good")
    refused("--workers with --dtype f64 (bad usage)", good, "runs in-process only (no --workers)",
            ["--workers", "2", "--dtype", "f64"], code=2)
    refused("--schedule wavefront (bad usage)", good, "--schedule wavefront is not available for Mamba-2",
            ["--schedule", "wavefront"], code=2)
    with open(os.path.join(good, "config.json")) as f:
        text = f.read()
    check("config.json as Python writes it holds Infinity (time_step_limit)",
          "Infinity" in text and json.loads(text)["time_step_limit"][1] == math.inf, text[:200])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adjsh", required=True)
    ap.add_argument("--quick", action="store_true", help="T in {2, 97} only")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="adjsh_mamba2_") as tmp:
        check_reference()
        check_transformers(tmp)
        check_gradients(args.adjsh, tmp, args.quick)
        check_spans(args.adjsh, tmp)
        check_workers(args.adjsh, tmp)
        check_storage(args.adjsh, tmp)
        check_eval(args.adjsh, tmp)
        check_generate(args.adjsh, tmp)
        check_bad_input(args.adjsh, tmp)
    print(f"{'FAILED' if FAILS else 'OK'}: {len(FAILS)} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
