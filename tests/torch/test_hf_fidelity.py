#!/usr/bin/env python3
"""Hugging Face fidelity of adjsh's checkpoints, with `transformers` (the project venv).

Usage (the venv of scripts/setup-venv.sh, which has transformers 4.44 over Debian's torch):
  .venv/bin/python tests/torch/test_hf_fidelity.py --adjsh build/cli/adjsh

A tiny MambaForCausalLM is made and saved by transformers (`save_pretrained`, with extra
config keys and pad/bos/eos ids of its own, and a tokenizer.json beside it); then:
  * adjsh trains it (2 steps) and each checkpoint folder loads in transformers
    (`from_pretrained`), with the unknown config keys, the token ids and the tokenizer files
    kept; transformers' loss of the checkpoint in f64 equals `adjsh grad --dtype f64`'s on the
    same tokens (< 1e-10 relative) and the weights are the ones adjsh saved;
  * transformers' loss of the model it saved equals adjsh's before training (< 1e-10);
  * --save-dtype bf16 writes BF16 tensors that transformers loads;
  * a config.json of another model_type (jamba) is refused naming model_type, nothing written;
    a Mamba-2 model from save_pretrained (model_type mamba2) has transformers' loss in adjsh
    grad; adjsh trains an untied one, and its checkpoint loads in transformers with adjsh's
    loss, keeping the config's keys.
Prints PASS/FAIL per case and `N passed, N failed`; exits 1 on any failure.
"""
import argparse
import contextlib
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import Results, read_scalar  # noqa: E402

try:
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM
except ImportError as e:  # pragma: no cover - the suite's setup installs them
    sys.exit(f"test_hf_fidelity: needs transformers and torch ({e}): run scripts/setup-venv.sh")

V, T = 61, 200


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


@contextlib.contextmanager
def keep_f64():
    """transformers' Mamba rounds to f32 in places even in an f64 model (.float() of A_log, B,
    x and the logits; .to(torch.float32) in RMSNorm and the residual): for the length of the
    block those casts leave f64 tensors as they are, so the whole forward runs in f64."""
    float_, to_ = torch.Tensor.float, torch.Tensor.to

    def as_float(t, *args, **kwargs):
        return t if t.dtype == torch.float64 else float_(t, *args, **kwargs)

    def to(t, *args, **kwargs):
        target = args[0] if args else kwargs.get("dtype")
        if t.dtype == torch.float64 and target is torch.float32:
            return t
        return to_(t, *args, **kwargs)

    torch.Tensor.float, torch.Tensor.to = as_float, to
    try:
        yield
    finally:
        torch.Tensor.float, torch.Tensor.to = float_, to_


def hf_loss(model_dir, ids):
    """transformers' own mean next-token loss of ids (MambaForCausalLM with labels), in f64."""
    m = MambaForCausalLM.from_pretrained(model_dir).to(torch.float64).eval()
    with torch.no_grad(), keep_f64():
        # use_cache=False: the cache of transformers 4.44 needs torch._dynamo (torch >= 2).
        out = m(torch.tensor([ids]), labels=torch.tensor([ids]), use_cache=False)
    assert out.logits.dtype == torch.float64
    return out.loss.item(), m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    a = ap.parse_args()
    res = Results()
    check = res.record

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "hf")
        cfg = MambaConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2, state_size=4,
                          expand=2, conv_kernel=4, time_step_rank=2, pad_token_id=3,
                          bos_token_id=4, eos_token_id=5)
        cfg.custom_note = "kept by adjsh"
        MambaForCausalLM(cfg).save_pretrained(src, safe_serialization=True)
        with open(os.path.join(src, "tokenizer.json"), "w") as f:
            f.write('{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}}}')
        ids = [(i * 17 + i // 5) % V for i in range(T)]
        tokens = os.path.join(tmp, "t.u32")
        with open(tokens, "wb") as f:
            f.write(struct.pack(f"<{T}I", *ids))

        # transformers' model, read by adjsh: the same loss.
        g0 = os.path.join(tmp, "g0.safetensors")
        rc, _, err = run([a.adjsh, "grad", "--model", src, "--tokens", tokens, "--dtype", "f64",
                          "--chunk", "32", "--out", g0, "--quiet"])
        check("adjsh grad reads a save_pretrained model", rc == 0, err)
        if rc == 0:
            want, _ = hf_loss(src, ids)
            got = read_scalar(g0)
            check(f"loss of the HF model: adjsh {got!r} = transformers {want!r} (< 1e-10)",
                  abs(got - want) <= 1e-10 * abs(want), (got, want))

        # adjsh trains it; its checkpoint loads in transformers.
        def train(model, name, steps):
            """adjsh train on the tokens: (rc, stderr, the latest step folder or None)."""
            ck = os.path.join(tmp, name)
            rc, _, err = run([a.adjsh, "train", "--model", model, "--tokens", tokens,
                              "--context", "100", "--steps", str(steps), "--checkpoint-dir", ck,
                              "--lr", "1e-2"])
            latest = os.path.join(ck, "latest")
            step = os.path.join(ck, open(latest).read().strip()) if rc == 0 else None
            return rc, err, step

        rc, err, step = train(src, "ck", 2)
        check("adjsh train --model (a save_pretrained folder)", rc == 0, err)
        if rc == 0:
            conf = json.load(open(os.path.join(step, "config.json")))
            check("unknown config keys and pad/bos/eos ids kept",
                  conf.get("custom_note") == "kept by adjsh" and conf.get("pad_token_id") == 3
                  and conf.get("bos_token_id") == 4 and conf.get("eos_token_id") == 5, conf)
            check("tokenizer.json copied into the checkpoint",
                  os.path.exists(os.path.join(step, "tokenizer.json")), os.listdir(step))
            g1 = os.path.join(tmp, "g1.safetensors")
            rc, _, err = run([a.adjsh, "grad", "--model", step, "--tokens", tokens, "--dtype",
                              "f64", "--chunk", "32", "--out", g1, "--quiet"])
            want, m = hf_loss(step, ids)
            got = read_scalar(g1) if rc == 0 else float("nan")
            check(f"checkpoint loads in transformers with adjsh's loss ({got!r} vs {want!r})",
                  rc == 0 and abs(got - want) <= 1e-10 * abs(want), err)
            start, _ = hf_loss(src, ids)
            check("the checkpoint is the trained model (its loss moved)", abs(want - start) > 1e-6,
                  (want, start))

        # --save-dtype bf16.
        ck16 = os.path.join(tmp, "ck16")
        rc, _, err = run([a.adjsh, "train", "--model", src, "--tokens", tokens, "--context",
                          "100", "--steps", "1", "--checkpoint-dir", ck16, "--save-dtype", "bf16"])
        if rc == 0:
            step = os.path.join(ck16, open(os.path.join(ck16, "latest")).read().strip())
            with open(os.path.join(step, "model.safetensors"), "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
            dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
            loss16, _ = hf_loss(step, ids)
            check(f"--save-dtype bf16: BF16 tensors, loads in transformers (loss {loss16:.4f})",
                  dtypes == {"BF16"} and loss16 == loss16, dtypes)
        else:
            check("--save-dtype bf16", False, err)

        # An untied LM head (tie_word_embeddings false: lm_head.weight of its own) read, trained
        # and written: transformers' loss before and after, and the head stays untied.
        usrc = os.path.join(tmp, "hf-untied")
        ucfg = MambaConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2, state_size=4,
                           expand=2, conv_kernel=4, time_step_rank=2, tie_word_embeddings=False)
        MambaForCausalLM(ucfg).save_pretrained(usrc, safe_serialization=True)
        gu = os.path.join(tmp, "gu.safetensors")
        rc, _, err = run([a.adjsh, "grad", "--model", usrc, "--tokens", tokens, "--dtype", "f64",
                          "--chunk", "32", "--out", gu, "--quiet"])
        want, m = hf_loss(usrc, ids)
        got = read_scalar(gu) if rc == 0 else float("nan")
        untied = not torch.equal(m.lm_head.weight, m.backbone.embeddings.weight)
        check(f"untied head: adjsh's loss {got!r} = transformers' {want!r} (< 1e-10)",
              rc == 0 and untied and abs(got - want) <= 1e-10 * abs(want), err)
        cku = os.path.join(tmp, "cku")
        rc, _, err = run([a.adjsh, "train", "--model", usrc, "--tokens", tokens, "--context",
                          "100", "--steps", "2", "--checkpoint-dir", cku, "--lr", "1e-2"])
        if rc == 0:
            step = os.path.join(cku, open(os.path.join(cku, "latest")).read().strip())
            g2 = os.path.join(tmp, "g2.safetensors")
            rc2, _, err2 = run([a.adjsh, "grad", "--model", step, "--tokens", tokens, "--dtype",
                                "f64", "--chunk", "32", "--out", g2, "--quiet"])
            want2, m2 = hf_loss(step, ids)
            got2 = read_scalar(g2) if rc2 == 0 else float("nan")
            conf = json.load(open(os.path.join(step, "config.json")))
            moved = (m2.lm_head.weight - m.lm_head.weight).abs().max().item()
            check(f"untied head: adjsh train's checkpoint loads in transformers with adjsh's loss "
                  f"({got2!r} vs {want2!r}), tie_word_embeddings false, lm_head trained "
                  f"(moved {moved:.1e})",
                  rc2 == 0 and abs(got2 - want2) <= 1e-10 * abs(want2) and
                  conf.get("tie_word_embeddings") is False and moved > 0 and
                  not torch.equal(m2.lm_head.weight, m2.backbone.embeddings.weight), err2)
        else:
            check("untied head: adjsh train", False, err)

        # Another model_type is refused by name.
        bad = os.path.join(tmp, "jamba")
        os.makedirs(bad)
        conf = json.load(open(os.path.join(src, "config.json")))
        conf["model_type"] = "jamba"
        json.dump(conf, open(os.path.join(bad, "config.json"), "w"))
        os.link(os.path.join(src, "model.safetensors"), os.path.join(bad, "model.safetensors"))
        out = os.path.join(tmp, "x.safetensors")
        rc, _, err = run([a.adjsh, "grad", "--model", bad, "--tokens", tokens, "--out", out])
        check("model_type jamba refused by name, nothing written",
              rc == 1 and "model_type" in err and "jamba" in err and not os.path.exists(out), err)

        # A real Mamba-2 folder from save_pretrained: its config.json holds Infinity (the
        # default time_step_limit), which Python's json writes and strict JSON has not; adjsh
        # reads it and computes its gradient, with transformers' loss (T = 200 is inside one
        # of its 256-token chunks, G = 1: where its torch path is Mamba-2's definition; it
        # rounds parts to f32 even in an f64 model).
        m2 = os.path.join(tmp, "hf-mamba2")
        Mamba2ForCausalLM(Mamba2Config(vocab_size=V, hidden_size=16, num_heads=4, head_dim=8,
                                       n_groups=1, state_size=8, num_hidden_layers=1,
                                       expand=2)).save_pretrained(m2, safe_serialization=True)
        has_inf = "Infinity" in open(os.path.join(m2, "config.json")).read()
        rc, _, err = run([a.adjsh, "grad", "--model", m2, "--tokens", tokens, "--out", out,
                          "--dtype", "f64", "--quiet"])
        hf = Mamba2ForCausalLM.from_pretrained(m2).to(torch.float64)
        with torch.no_grad():
            want = float(hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss)
        got = read_scalar(out) if rc == 0 else float("nan")
        check(f"a save_pretrained Mamba-2 (config.json with Infinity): adjsh grad's loss "
              f"{got:.9f} = transformers' {want:.9f} (f32 rounding)",
              has_inf and rc == 0 and abs(got - want) <= 1e-5 * abs(want), err)

        # adjsh trains that Mamba-2 model (untied head, two layers, extra keys and token ids of
        # its own); its checkpoint loads in transformers with adjsh's loss (f32 rounding, as
        # above) and keeps the keys, the head and Infinity.
        m2u = os.path.join(tmp, "hf-mamba2-untied")
        cfg2 = Mamba2Config(vocab_size=V, hidden_size=16, num_heads=4, head_dim=8, n_groups=1,
                            state_size=8, num_hidden_layers=2, expand=2,
                            tie_word_embeddings=False, pad_token_id=3, eos_token_id=5)
        cfg2.custom_note = "kept by adjsh"
        Mamba2ForCausalLM(cfg2).save_pretrained(m2u, safe_serialization=True)
        rc, err, step = train(m2u, "ck-mamba2", 3)
        check("adjsh train --model (a save_pretrained Mamba-2 folder)", rc == 0, err)
        if rc == 0:
            text = open(os.path.join(step, "config.json")).read()
            conf = json.loads(text)
            check("Mamba-2 checkpoint: model_type, untied head, extra keys, ids and Infinity kept",
                  conf.get("model_type") == "mamba2" and conf.get("tie_word_embeddings") is False
                  and conf.get("custom_note") == "kept by adjsh" and conf.get("pad_token_id") == 3
                  and conf.get("eos_token_id") == 5 and "Infinity" in text, text)
            rc, _, err = run([a.adjsh, "grad", "--model", step, "--tokens", tokens, "--out", out,
                              "--dtype", "f64", "--quiet"])
            hf = Mamba2ForCausalLM.from_pretrained(step).to(torch.float64)
            start = Mamba2ForCausalLM.from_pretrained(m2u).to(torch.float64)
            with torch.no_grad():
                want = float(hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss)
                before = float(start(torch.tensor([ids]), labels=torch.tensor([ids])).loss)
                heads_differ = not torch.equal(hf.lm_head.weight, hf.backbone.embeddings.weight)
            got = read_scalar(out) if rc == 0 else float("nan")
            check(f"the Mamba-2 checkpoint loads in transformers with adjsh's loss ({got:.9f} vs "
                  f"{want:.9f}), untied, and trained (loss {before:.6f} before)",
                  rc == 0 and abs(got - want) <= 1e-5 * abs(want) and heads_differ
                  and abs(want - before) > 1e-4, err)

    return res.summary()


if __name__ == "__main__":
    sys.exit(main())
