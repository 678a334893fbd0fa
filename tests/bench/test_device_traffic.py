#!/usr/bin/python3
"""bench/device_traffic (one step's host-device traffic with the CUDA backend, counted on the
host-emulated device with its kernels skipped): --help; bad flags refused with a message and
exit 2; for both model types a small step reports its plan's task count, finite counts that
include the weights' upload, at least one sync per task (the backend syncs every call), and the
same line twice (the counts follow from the host code alone). The exact counts of a call are
tests/cuda/block_emulation_test.cc's (BlockTrafficTest).

  test_device_traffic.py --device-traffic PATH --adjsh PATH
"""
import argparse
import json
import math
import subprocess
import sys

SHAPE = ["--hidden-size", "16", "--layers", "2", "--vocab-size", "64", "--tokens", "1000",
         "--chunk", "64", "--spans", "4"]


def run(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device-traffic", required=True)
    ap.add_argument("--adjsh", required=True)
    a = ap.parse_args()
    usage = run(a.device_traffic, "--help")
    assert usage.returncode == 0 and "--tokens" in usage.stdout, usage
    for flags, word in ((["--tokens", "0"], "tokens"), (["--model-type", "rwkv"], "model-type"),
                        (["--chunk", "x"], "chunk"), (["--nonsense"], "nonsense")):
        bad = run(a.device_traffic, *flags)
        assert bad.returncode == 2 and word in bad.stderr, (flags, bad.returncode, bad.stderr)

    plan = json.loads(run(a.adjsh, "plan", "--context", "1000", "--chunk", "64", "--spans", "4",
                          "--layers", "2").stdout)
    for model in ("mamba", "mamba2"):
        extra = ["--state-size", "8", "--head-dim", "8"] if model == "mamba2" else []
        first = run(a.device_traffic, "--model-type", model, *SHAPE, *extra)
        assert first.returncode == 0, (model, first.stderr)
        r = json.loads(first.stdout)
        assert r["tasks"] == plan["num_tasks"] and r["spans"] == 4, (model, r, plan["num_tasks"])
        for k, v in r.items():
            if isinstance(v, (int, float)):
                assert math.isfinite(v) and v >= 0, (model, k, v)
        assert r["h2d_bytes"] >= r["param_bytes"], (model, r)  # the weights went up
        assert r["d2h_bytes"] > 0 and r["allocations"] >= 2, (model, r)
        assert r["syncs"] >= r["tasks"], (model, r)
        again = run(a.device_traffic, "--model-type", model, *SHAPE, *extra)
        assert again.stdout == first.stdout, (model, first.stdout, again.stdout)
    print("device_traffic: flags, both model types, repeatable counts: ok")


if __name__ == "__main__":
    sys.exit(main())
