#!/usr/bin/env python3
"""End-to-end checks of `--device` / `--storage` on adjsh grad, train and worker (the
coordinator computes nothing and takes no --device).

Usage:
  test_device.py --adjsh build/cli/adjsh [--expect-gpu]

Standard library only. On any machine: malformed values are bad usage (exit 2, the flag named);
a device this process cannot use (cuda:1023; any CUDA device in a build without CUDA or on a
machine without a GPU; a worker's GPU bf16 storage on the CPU; f64 on a GPU) fails with exit 1 and a message
naming it, never a crash or a hang; `--device cpu` writes the same bytes as the default;
`--worker-device` is checked, passed to a local cluster's workers, and a worker that cannot use
its device is given up (the run ends with the reason when no worker is left). Where
`--device cuda:0` works (a GPU), its gradient is compared with the CPU's. The same for a
Mamba-2 model (check_mamba2). With --expect-gpu (scripts/gpu-check.sh on a GPU machine), a
refused `cuda:0` fails instead of taking the no-GPU path, and so does a run in which the GPU
cases did not all run: on a GPU machine, skipping them is a failure.
Prints one PASS/FAIL line per case and `N passed, N failed` last; exits 1 if any case failed.
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import read_f32_tensors  # noqa: E402

TIMEOUT_S = 60
CRASH_MARKERS = ("Segmentation fault", "terminate called", "Aborted", "core dumped",
                 "check failed", "ADJSH_CHECK")


def run(adjsh, args):
    p = subprocess.run([adjsh] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=TIMEOUT_S, text=True)
    return p.returncode, p.stdout, p.stderr


def read_loss(path):
    """The scalar 'loss' tensor of a safetensors file written by adjsh grad (f32)."""
    return read_f32_tensors(path)["loss"][0]


def max_rel_l2(ref_path, got_path):
    """The largest ||got - ref|| / ||ref|| over the tensors of ref (inf if one is missing)."""
    ref, got = read_f32_tensors(ref_path), read_f32_tensors(got_path)
    worst = 0.0
    for name, r in ref.items():
        g = got.get(name)
        if g is None or len(g) != len(r):
            return float("inf")
        norm = sum(x * x for x in r) ** 0.5
        diff = sum((x - y) ** 2 for x, y in zip(r, g)) ** 0.5
        worst = max(worst, diff / norm if norm > 0 else diff)
    return worst


def check_mamba2(adjsh, tmp, tokens, check, no_crash, expect_gpu=False, gpu_ran=None):
    """A Mamba-2 model's gradient on a device (kernels/mamba2_chunk_ops.h): refused with the
    reason where the device cannot be used or lacks what is asked (f64, bf16 storage on a GPU);
    with a GPU, the GPU's gradient, in-process and through GPU workers, is the CPU's within
    1e-4 (f32 both, different summation orders)."""
    model = os.path.join(tmp, "m2")
    rc, _, err = run(adjsh, ["init", "--model-type", "mamba2", "--hidden-size", "8", "--layers",
                             "2", "--vocab-size", "11", "--state-size", "4", "--head-dim", "4",
                             "--out", model])
    check("init a Mamba-2 model", rc == 0, err)
    grad = ["grad", "--model", model, "--tokens", tokens, "--chunk", "5", "--quiet", "--out"]
    out = lambda name: os.path.join(tmp, name)  # noqa: E731
    rc, _, err = run(adjsh, grad + [out("m2-cpu.safetensors")])
    check("Mamba-2 grad on the cpu", rc == 0, err)
    for extra, word in ((["--device", "cuda:1023"], "cuda:1023"),
                        (["--device", "cuda:0", "--dtype", "f64"], "cuda:0"),
                        (["--device", "cuda:0", "--storage", "bf16"], "cuda:0")):
        path = out("m2-x.safetensors")
        rc, _, err = run(adjsh, grad + [path] + extra)
        check(f"Mamba-2 grad {' '.join(extra)}: refused naming {word}",
              rc == 1 and word in err and no_crash(rc, err) and not os.path.exists(path),
              f"rc={rc} stderr={err!r}")
    rc, _, err = run(adjsh, grad + [out("m2-none.safetensors"), "--workers", "1",
                                    "--worker-device", "cuda:1023"])
    check("Mamba-2 grad --workers 1 --worker-device cuda:1023: exit 1, the worker's reason",
          rc == 1 and "no worker left" in err and no_crash(rc, err), f"rc={rc} stderr={err!r}")
    for cmd in (["eval", "--model", model, "--tokens", tokens, "--quiet"],
                ["generate", "--model", model, "--prompt-tokens", tokens, "--max-new-tokens",
                 "2", "--temperature", "0"]):
        rc, _, err = run(adjsh, cmd + ["--device", "cuda:1023"])
        check(f"Mamba-2 {cmd[0]} --device cuda:1023: refused naming it",
              rc == 1 and "cuda:1023" in err and no_crash(rc, err), f"rc={rc} stderr={err!r}")
    rc, _, err = run(adjsh, grad + [out("m2-gpu.safetensors"), "--device", "cuda:0"])
    if rc != 0:
        if expect_gpu:
            check("--expect-gpu: Mamba-2 grad --device cuda:0 runs", False, f"rc={rc} stderr={err!r}")
        else:
            check("Mamba-2 grad --device cuda:0 without a usable GPU: exit 1, no crash",
                  rc == 1 and "cuda:0" in err and no_crash(rc, err), f"rc={rc} stderr={err!r}")
        return
    if gpu_ran is not None:
        gpu_ran.append("mamba2")
    worst = max_rel_l2(out("m2-cpu.safetensors"), out("m2-gpu.safetensors"))
    check(f"Mamba-2 grad --device cuda:0 matches cpu (worst tensor rel L2 {worst:.1e} <= 1e-4)",
          worst <= 1e-4, err)
    rc, _, err = run(adjsh, grad + [out("m2-gpu-w.safetensors"), "--workers", "2",
                                    "--worker-device", "cuda:0"])
    worst = max_rel_l2(out("m2-cpu.safetensors"), out("m2-gpu-w.safetensors")) if rc == 0 \
        else float("inf")
    check(f"Mamba-2 grad --workers 2 --worker-device cuda:0 matches cpu (worst tensor rel L2 "
          f"{worst:.1e} <= 1e-4)", worst <= 1e-4, f"rc={rc} {err[-800:]}")
    ev = ["eval", "--model", model, "--tokens", tokens, "--chunk", "5", "--quiet"]
    rc1, cpu_out, e1 = run(adjsh, ev)
    rc2, gpu_out, e2 = run(adjsh, ev + ["--device", "cuda:0"])
    l_cpu = float(cpu_out.split()[1]) if rc1 == 0 else float("nan")
    l_gpu = float(gpu_out.split()[1]) if rc2 == 0 else float("inf")
    check(f"Mamba-2 eval --device cuda:0: loss {l_gpu} = cpu's {l_cpu} (1e-5 relative)",
          abs(l_gpu - l_cpu) <= 1e-5 * abs(l_cpu), e1 + e2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adjsh", required=True)
    ap.add_argument("--expect-gpu", action="store_true",
                    help="a GPU machine: fail where cuda:0 is refused or the GPU cases skip")
    a = ap.parse_args()
    results = []
    gpu_ran = []  # the GPU cases that ran: the Mamba-1 and the Mamba-2 gradients

    def check(name, ok, detail=""):
        results.append(ok)
        print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail))

    def no_crash(rc, err):
        return rc >= 0 and not any(m in err for m in CRASH_MARKERS)

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        tokens = os.path.join(tmp, "t.u32")
        rc, _, err = run(a.adjsh, ["init", "--hidden-size", "8", "--layers", "2", "--vocab-size",
                                   "11", "--state-size", "4", "--out", model])
        check("init", rc == 0, err)
        with open(tokens, "wb") as f:
            f.write(struct.pack("<23I", *[(7 * i + 3) % 11 for i in range(23)]))
        grad = ["grad", "--model", model, "--tokens", tokens, "--chunk", "5", "--quiet"]
        out = lambda name: os.path.join(tmp, name)  # noqa: E731
        commands = {
            "grad": grad + ["--out", out("g.safetensors")],
            "train": ["train", "--hidden-size", "8", "--layers", "1", "--vocab-size", "11",
                      "--tokens", tokens, "--context", "8", "--steps", "1",
                      "--checkpoint-dir", out("ckpt")],
            "worker": ["worker", "--coordinator", "127.0.0.1:1", "--quiet"],
        }
        rc, _, err = run(a.adjsh, ["coordinator", "--listen", "127.0.0.1:0", "--state-dir",
                                   out("state"), "--insecure-local", "--quiet", "--device", "cpu"])
        check("coordinator --device: bad usage (it computes nothing)",
              rc == 2 and "--device" in err and no_crash(rc, err), f"rc={rc} stderr={err!r}")

        for cmd, args in commands.items():
            bad = [(["--device", "gpu"], "'gpu'"), (["--device", "cuda:x"], "'cuda:x'")]
            bad.append((["--storage", "fp16"], "'fp16'"))
            for flags, what in bad:
                rc, _, err = run(a.adjsh, args + flags)
                check(f"{cmd} {' '.join(flags)}: bad usage", rc == 2 and what in err and
                      no_crash(rc, err), f"rc={rc} stderr={err!r}")
            rc, _, err = run(a.adjsh, args + ["--device", "cuda:1023"])
            check(f"{cmd} --device cuda:1023: refused", rc == 1 and "cuda:1023" in err and
                  no_crash(rc, err), f"rc={rc} stderr={err!r}")
            rc, out_text, err = run(a.adjsh, [cmd, "--help"])
            check(f"{cmd} --help documents --device", rc == 0 and "--device cpu|cuda:N" in out_text
                  and "--storage full|bf16" in out_text, out_text)
        # A worker's --storage bf16 is the GPU's activation storage: refused on the CPU.
        rc, _, err = run(a.adjsh, commands["worker"] + ["--storage", "bf16"])
        check("worker --storage bf16 on cpu: refused", rc == 1 and "bf16" in err and
              no_crash(rc, err), f"rc={rc} stderr={err!r}")

        # f64 and the truncated window on a GPU are refused (or the GPU itself is absent).
        for extra, word in ((["--dtype", "f64"], "f64"), (["--window", "4"], "truncated")):
            path = out("x.safetensors")
            rc, _, err = run(a.adjsh, grad + ["--out", path, "--device", "cuda:0"] + extra)
            check(f"grad --device cuda:0 {' '.join(extra)}: refused",
                  rc == 1 and ("cuda:0" in err) and no_crash(rc, err) and not os.path.exists(path),
                  f"rc={rc} stderr={err!r}")
            if rc == 1 and "CUDA device" not in err and "without CUDA" not in err:
                check(f"grad --device cuda:0 {' '.join(extra)}: names the op", word in err, err)

        # --device cpu is the default path: the same bytes.
        rc1, _, e1 = run(a.adjsh, grad + ["--out", out("default.safetensors")])
        rc2, _, e2 = run(a.adjsh, grad + ["--out", out("cpu.safetensors"), "--device", "cpu"])
        same = rc1 == 0 and rc2 == 0 and open(out("default.safetensors"), "rb").read() == \
            open(out("cpu.safetensors"), "rb").read()
        check("grad --device cpu writes the default's bytes", same, e1 + e2)

        # A CPU process maps no CUDA library: cuBLAS (with libcublasLt, ~140 MiB resident at
        # load) is loaded only when a CUDA device is used (kernels/cuda/cublas_api.h).
        p = subprocess.Popen([a.adjsh, "worker", "--coordinator", "127.0.0.1:1", "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)  # started, retrying its connection
            with open(f"/proc/{p.pid}/maps") as f:
                cuda_maps = sorted({line.split()[-1] for line in f
                                    if "libcublas" in line or "libcudart" in line})
            with open(f"/proc/{p.pid}/status") as f:
                rss = [line.split()[1] for line in f if line.startswith("VmRSS")]
        finally:
            p.kill()
            p.wait()
        check(f"a CPU worker maps no CUDA library (VmRSS {rss[0] if rss else '?'} kB)",
              not cuda_maps, " ".join(cuda_maps))

        # --worker-device: the devices of a local cluster's workers (grad and train --workers).
        train = commands["train"]
        for cmd, args in (("grad", grad + ["--out", out("w.safetensors")]), ("train", train)):
            rc, _, err = run(a.adjsh, args + ["--workers", "1", "--worker-device", "cpu,gpu"])
            check(f"{cmd} --worker-device cpu,gpu: bad usage", rc == 2 and "--worker-device" in err
                  and "'gpu'" in err and no_crash(rc, err), f"rc={rc} stderr={err!r}")
            rc, _, err = run(a.adjsh, args + ["--worker-device", "cpu"])
            check(f"{cmd} --worker-device without --workers: bad usage",
                  rc == 2 and "needs --workers" in err, f"rc={rc} stderr={err!r}")
        rc, _, err = run(a.adjsh, grad + ["--out", out("w.safetensors"), "--workers", "2",
                                          "--worker-device", "cpu"])
        same = rc == 0 and open(out("w.safetensors"), "rb").read() == \
            open(out("cpu.safetensors"), "rb").read()
        check("grad --workers 2 --worker-device cpu writes the in-process bytes", same, err)
        # A worker that cannot use its device exits at start; given up after 3 tries, the run
        # goes on with the others, or ends with the reason when none is left (never a hang).
        path = out("none.safetensors")
        rc, _, err = run(a.adjsh, grad + ["--out", path, "--workers", "1",
                                          "--worker-device", "cuda:1023"])
        check("grad --workers 1 --worker-device cuda:1023: exit 1, the worker's reason",
              rc == 1 and "cuda:1023" in err and "cannot start" in err and "no worker left" in err
              and no_crash(rc, err) and not os.path.exists(path), f"rc={rc} stderr={err!r}")
        rc, _, err = run(a.adjsh, train + ["--workers", "1", "--worker-device", "cuda:1023",
                                           "--checkpoint-dir", out("ck-none")])
        check("train --workers 1 --worker-device cuda:1023: exit 1, no checkpoint",
              rc == 1 and "no worker left" in err and not os.path.exists(out("ck-none/latest")),
              f"rc={rc} stderr={err!r}")
        rc, _, err = run(a.adjsh, ["train", "--hidden-size", "8", "--layers", "1", "--vocab-size",
                                   "11", "--tokens", tokens, "--context", "8", "--steps", "1500",
                                   "--checkpoint-every", "0", "--checkpoint-dir", out("ck-one"),
                                   "--workers", "2", "--worker-device", "cpu,cuda:1023"])
        check("train --workers 2 --worker-device cpu,cuda:1023: goes on with the cpu worker",
              rc == 0 and "going on with 1 worker(s)" in err, f"rc={rc} stderr={err[-1500:]!r}")

        # With a GPU: the CUDA gradient's loss agrees with the CPU's.
        rc, _, err = run(a.adjsh, grad + ["--out", out("gpu.safetensors"), "--device", "cuda:0"])
        if rc == 0:
            gpu_ran.append("mamba")
            l_cpu, l_gpu = read_loss(out("cpu.safetensors")), read_loss(out("gpu.safetensors"))
            check("grad --device cuda:0 loss matches cpu", abs(l_cpu - l_gpu) <= 1e-5 * abs(l_cpu),
                  f"{l_cpu} vs {l_gpu}")
            # 5 spans (the default here: one per chunk), and the two-pass schedule, on the GPU.
            rc, _, err = run(a.adjsh, grad + ["--out", out("gpu-2p.safetensors"), "--device",
                                              "cuda:0", "--schedule", "two-pass"])
            err_2p = max_rel_l2(out("cpu.safetensors"), out("gpu-2p.safetensors")) if rc == 0 \
                else float("inf")
            check(f"grad --device cuda:0 --schedule two-pass matches cpu (worst tensor rel L2 "
                  f"{err_2p:.1e} <= 1e-4)", err_2p <= 1e-4, f"rc={rc} {err[-800:]}")
            # The local cluster's workers on the GPU (tasks through the worker's CUDA path).
            rc, _, err = run(a.adjsh, grad + ["--out", out("gpu-w.safetensors"), "--workers", "2",
                                              "--worker-device", "cuda:0"])
            # The loss is the coordinator's (CPU); the gradient is the workers'. f32 on both
            # sides, different summation orders: ~1e-6 relative; a broken path is O(1).
            err_w = max_rel_l2(out("cpu.safetensors"), out("gpu-w.safetensors")) if rc == 0 \
                else float("inf")
            check(f"grad --workers 2 --worker-device cuda:0 gradient matches cpu (worst "
                  f"tensor rel L2 {err_w:.1e} <= 1e-4)", err_w <= 1e-4, f"rc={rc} {err[-800:]}")
        elif a.expect_gpu:
            check("--expect-gpu: grad --device cuda:0 runs", False, f"rc={rc} stderr={err!r}")
        else:
            check("grad --device cuda:0 without a usable GPU: exit 1, no crash",
                  rc == 1 and "cuda:0" in err and no_crash(rc, err), f"rc={rc} stderr={err!r}")
            # A missing or too old driver is said as that, with the runtime's CUDA version.
            if "driver" in err:
                check("a missing or old NVIDIA driver is named, with the CUDA runtime version",
                      "no NVIDIA driver is installed" in err or "older than this adjsh's CUDA"
                      in err, err)

        check_mamba2(a.adjsh, tmp, tokens, check, no_crash, a.expect_gpu, gpu_ran)

    if a.expect_gpu:
        check(f"--expect-gpu: every GPU case ran (ran: {', '.join(gpu_ran) or 'none'})",
              gpu_ran == ["mamba", "mamba2"])

    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
