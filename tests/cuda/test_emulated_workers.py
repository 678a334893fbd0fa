#!/usr/bin/env python3
"""GPU workers where no GPU is: the whole CLI over the host-emulated GPU (adjsh_emulated_gpu,
tests/cuda/emulated_gpu_backend.cc), each process a GPU of its own, its spans resident on it.

  test_emulated_workers.py --adjsh build/tests/cuda/adjsh_emulated_gpu [--keep]

For Mamba-1 and Mamba-2 (tiny shapes: every kernel runs on host threads):
  - `grad --workers W --worker-device cuda:0` for W = 1, 2, 4 writes bitwise the
    gradient of the in-process `grad --device cuda:0` (the resident step summing its partials on
    the device; the workers bring each task's partials down and sum them in the worker tree);
    so does Mamba-1's with 2 workers whose rows are all past the device budget
    (`--device-mem-mib 0`: mapped host memory);
  - a training job on a coordinator with 2 GPU workers, one SIGKILLed as it leases a forward task
    and another as it leases a backward task (each started again under a new name; the spans
    they owned rebuilt onto their new owners' devices), ends with bitwise the weights and
    optimizer state of `train --device cuda:0` in-process.
"""
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from harness import final_files, run_adjsh, run_process_test, train_reference, wait_for  # noqa

CONTEXT, CHUNK, SPANS, STEPS = 256, 32, 4, 2
MODELS = {  # name: (init flags, worker counts)
    "Mamba-1": (["--hidden-size", "8", "--layers", "2", "--state-size", "4"], [1, 2, 4]),
    "Mamba-2": (["--model-type", "mamba2", "--hidden-size", "8", "--layers", "2",
                 "--state-size", "4", "--head-dim", "4"], [1, 2, 4]),
}
GPU = ("--device", "cuda:0")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def leased(cluster, name, kind):
    """Whether worker `name`'s log shows it leased a task of kind (SPAN_FORWARD, ...)."""
    try:
        with open(cluster.log_path(f"worker-{name}"), errors="replace") as f:
            return re.search(rf"leased: {kind} layer", f.read()) is not None
    except OSError:
        return False


def kill_at(cluster, addr, workers, kind, kills, deadline=600):
    """SIGKILLs the first worker seen leasing a task of kind and starts it again under a new
    name; returns its name, or None if none did before the deadline."""
    hit = wait_for(lambda: next((n for n in workers if leased(cluster, n, kind)), None),
                   deadline, interval=0.01)
    if hit is None:
        return None
    os.kill(workers[hit].pid, signal.SIGKILL)
    workers[hit].wait()
    fresh = f"{hit}-{kills}"
    del workers[hit]
    workers[fresh] = cluster.worker(addr, fresh, log="--verbose", flags=GPU)
    return hit


def body(adjsh, tmp, cluster, record):
    tokens = os.path.join(tmp, "tokens.u16")
    with open(tokens, "wb") as f:  # a fixed pseudo-random sequence over a 64-token vocabulary
        for i in range(CONTEXT):
            f.write(((i * 37 + i * i * 7 + 11) % 64).to_bytes(2, "little"))
    for name, (init, worker_counts) in MODELS.items():
        model = os.path.join(tmp, name)
        r = run_adjsh(adjsh, ["init", "--out", model, "--vocab-size", "64", *init])
        if not record(f"{name}: init", r.returncode == 0, r.stderr):
            continue
        grad = ["grad", "--model", model, "--tokens", tokens, "--chunk", str(CHUNK), "--spans",
                str(SPANS), "--quiet"]
        ref_path = os.path.join(tmp, f"{name}-inprocess.safetensors")
        t0 = time.time()
        r = run_adjsh(adjsh, [*grad, *GPU, "--out", ref_path], timeout=600)
        if not record(f"{name}: in-process grad on the emulated GPU ({time.time() - t0:.0f} s)",
                      r.returncode == 0, r.stderr):
            continue
        ref = read(ref_path)
        for w in worker_counts:
            out = os.path.join(tmp, f"{name}-w{w}.safetensors")
            t0 = time.time()
            r = run_adjsh(adjsh, [*grad, "--workers", str(w), "--worker-device", "cuda:0", "--out",
                                  out], timeout=600)
            record(f"{name}: {w} GPU worker(s) ({time.time() - t0:.0f} s): the gradient is "
                   "bitwise the in-process one", r.returncode == 0 and read(out) == ref,
                   r.stderr)
        if name == "Mamba-1":  # every row past the device budget: mapped host memory
            out = os.path.join(tmp, f"{name}-mapped.safetensors")
            t0 = time.time()
            r = run_adjsh(adjsh, [*grad, "--workers", "2", "--worker-device", "cuda:0",
                                  "--device-mem-mib", "0", "--out", out], timeout=600)
            record(f"{name}: 2 GPU workers, --device-mem-mib 0 ({time.time() - t0:.0f} s): the "
                   "gradient is bitwise the in-process one, and each worker says its device "
                   "peak", r.returncode == 0 and read(out) == ref and
                   len(re.findall(r"worker: cuda:0 held at most [0-9.]+ MiB", r.stderr)) == 2,
                   r.stderr)

        # A job on 2 GPU workers, one killed in the forward and one in the backward.
        flags = ["--model", model, "--tokens", tokens, "--context", str(CONTEXT), "--chunk",
                 str(CHUNK), "--spans", str(SPANS), "--steps", str(STEPS), "--checkpoint-every",
                 str(STEPS)]
        t0 = time.time()
        r, want = train_reference(adjsh, os.path.join(tmp, f"{name}-ref"), [*flags, *GPU],
                                  timeout=900)
        if not record(f"{name}: in-process training on the emulated GPU ({time.time() - t0:.0f} "
                      "s)", want is not None, r.stderr):
            continue
        _, addr = cluster.coordinator(os.path.join(tmp, f"{name}-state"), lease_ms=3000)
        if not record(f"{name}: coordinator started", addr):
            continue
        workers = {f"{name[-1]}w{k}": cluster.worker(addr, f"{name[-1]}w{k}", log="--verbose",
                                                     flags=GPU) for k in range(2)}
        ckpt = os.path.join(tmp, f"{name}-job")
        spec = {"model_dir": model, "token_file": tokens, "context_length": CONTEXT, "chunk": CHUNK,
                "spans": SPANS, "steps": STEPS, "checkpoint_every": STEPS,
                "checkpoint_dir": ckpt}
        job, r = cluster.submit(addr, spec)
        if not record(f"{name}: job submitted", job, r.stderr):
            continue
        t0 = time.time()
        fwd = kill_at(cluster, addr, workers, "SPAN_FORWARD", 1)
        record(f"{name}: worker {fwd} SIGKILLed as it leased a forward task", fwd)
        bwd = kill_at(cluster, addr, workers, "SPAN_BACKWARD", 2)
        record(f"{name}: worker {bwd} SIGKILLed as it leased a backward task", bwd)
        w = cluster.watch(addr, job, timeout=1200)
        record(f"{name}: the job SUCCEEDED ({time.time() - t0:.0f} s)", w.returncode == 0,
               w.stdout[-1500:] + w.stderr)
        record(f"{name}: final weights and optimizer state bitwise those of the in-process run",
               final_files(ckpt) == want)


if __name__ == "__main__":
    run_process_test("adjsh-emulated-workers-", body)
