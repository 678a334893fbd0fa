#!/usr/bin/python3
"""bench/emulated_step (one step with the CUDA backend on the host-emulated device): --help; bad
flags refused with a message and exit 2; counting (kernels skipped), for both model types a small
step reports its plan's task count, finite counts that include the weights' upload, at least one
sync per task, and the same line twice (the counts follow from the host code alone); Mamba-1's
resident step (its rows, head and sums on the device) waits for the device once per task and
moves about one gradient each way, not one per span; computing (kernels run), both model types'
gradient and loss equal the CPU backend's within f32 rounding (relative L2 < 1e-4: two f32
computations that sum in different orders), with the same bits on 1 and 3 threads and with the
span rows past a device budget (all of them, then about half) in mapped host memory. The exact
counts of a call are tests/cuda/block_emulation_test.cc's (BlockTrafficTest).

  test_emulated_step.py --emulated-step PATH --adjsh PATH
"""
import argparse
import json
import math
import subprocess
import sys

SHAPE = ["--hidden-size", "16", "--layers", "2", "--vocab-size", "64", "--tokens", "1000",
         "--chunk", "64", "--spans", "4"]
SMALL = ["--hidden-size", "16", "--layers", "2", "--vocab-size", "64", "--tokens", "150",
         "--chunk", "64", "--spans", "2"]
MAMBA2 = ["--state-size", "8", "--head-dim", "8"]


def run(exe, *args, timeout=120):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--emulated-step", required=True)
    ap.add_argument("--adjsh", required=True)
    a = ap.parse_args()
    exe = a.emulated_step
    usage = run(exe, "--help")
    assert usage.returncode == 0 and "--kernels" in usage.stdout, usage
    for flags, word in ((["--tokens", "0"], "tokens"), (["--model-type", "rwkv"], "model-type"),
                        (["--kernels", "some"], "kernels"), (["--chunk", "x"], "chunk"),
                        (["--nonsense"], "nonsense")):
        bad = run(exe, *flags)
        assert bad.returncode == 2 and word in bad.stderr, (flags, bad.returncode, bad.stderr)

    plan = json.loads(run(a.adjsh, "plan", "--context", "1000", "--chunk", "64", "--spans", "4",
                          "--layers", "2").stdout)
    for model in ("mamba", "mamba2"):
        extra = MAMBA2 if model == "mamba2" else []
        first = run(exe, "--model-type", model, *SHAPE, *extra)
        assert first.returncode == 0, (model, first.stderr)
        r = json.loads(first.stdout)
        assert r["tasks"] == plan["num_tasks"] and r["spans"] == 4, (model, r, plan["num_tasks"])
        for k, v in r.items():
            if isinstance(v, (int, float)):
                assert math.isfinite(v) and v >= 0, (model, k, v)
        assert r["h2d_bytes"] >= r["param_bytes"], (model, r)  # the weights went up
        assert r["d2h_bytes"] > 0 and r["allocations"] >= 2, (model, r)
        assert r["syncs"] >= r["tasks"], (model, r)
        if model == "mamba":  # resident: one wait per task; one gradient down, not one per span
            assert r["most_syncs_in_a_task"] == 1, r
            # With a vocabulary large enough that the (V, D) partials outweigh the per-task
            # summaries: 4 spans' partials per group would be 4x.
            wide = json.loads(run(exe, *SHAPE, "--vocab-size", "4096").stdout)
            assert wide["param_bytes"] <= wide["d2h_bytes"] < 1.5 * wide["param_bytes"], wide
            assert wide["param_bytes"] <= wide["h2d_bytes"] < 1.5 * wide["param_bytes"], wide
        again = run(exe, "--model-type", model, *SHAPE, *extra)
        assert again.stdout == first.stdout, (model, first.stdout, again.stdout)

        computed = run(exe, "--model-type", model, "--kernels", "run", *SMALL, *extra, timeout=300)
        assert computed.returncode == 0, (model, computed.stderr)
        c = json.loads(computed.stdout)
        assert c["rel_l2_vs_cpu"] < 1e-4, (model, c)
        assert abs(c["loss"] - c["loss_cpu"]) <= 1e-5 * abs(c["loss_cpu"]), (model, c)
        threads = run(exe, "--model-type", model, "--kernels", "run", "--threads", "3", *SMALL,
                      *extra, timeout=300)
        assert threads.returncode == 0, (model, threads.stderr)
        assert json.loads(threads.stdout)["digest"] == c["digest"], (model, threads.stdout, c)
        # Past the device budget rows are mapped host memory: every row (budget 0), then about
        # half of them; the same bits, less device memory.
        assert c["mapped_peak_bytes"] == 0, c
        spilled = []
        for budget in (0, None):
            if budget is None:
                budget = spilled[0]["mapped_peak_bytes"] // 2
            out = run(exe, "--model-type", model, "--kernels", "run", "--row-budget-bytes",
                      str(budget), *SMALL, *extra, timeout=300)
            assert out.returncode == 0, (model, budget, out.stderr)
            spilled.append(json.loads(out.stdout))
        for b in spilled:
            assert b["digest"] == c["digest"], (model, b, c)
            assert 0 < b["mapped_peak_bytes"], (model, b)
            assert b["device_peak_bytes"] < c["device_peak_bytes"], (model, b, c)
        assert spilled[1]["mapped_peak_bytes"] < spilled[0]["mapped_peak_bytes"], spilled
        print(f"  {model}: gradient {c['rel_l2_vs_cpu']:.2g} from the CPU's, loss "
              f"{c['loss']:.7f} / {c['loss_cpu']:.7f}")
    print("emulated_step: flags, counts (both model types, repeatable), gradients: ok")


if __name__ == "__main__":
    sys.exit(main())
