#!/usr/bin/python3
"""The simulator's efficiency table for fleets (docs/BENCHMARKS.md "Fleet efficiency"): the
worker tree's parallel efficiency at W = 8, 32, 128 for the 130M and 1.27B shapes at T = 1M
and 4M on 100 Gb/s links, with the coordinator's bytes per step and, where efficiency is below
70%, what bounds it: the span DAG's critical path beside the step, and the two largest
shares of the fleet's worker-seconds that are not compute (bench/fleet/breakdown.py).

  fleet_efficiency.py [--workers 8,32,128] [--T 1048576,4194304] [--speed 500] [--json FILE]

Each row is `bench/fleet_sim.py synth --reduce tree --owners round-robin --breakdown` with the
costs fitted on bench/data/T65536_W1_star.jsonl (a 2-core trace) divided by --speed (an H200
sustains about 500x this machine's f32 rate), chunk 4096, and S = max(T / 16384, W) spans (a
worker needs a span). The link model's latency and per-RPC overhead are the defaults that
tests/net/test_multihost.py checks against real links. Exit 2 on a failed simulation.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [("130M", "768,24,16,50280,2"), ("1.27B", "2048,48,16,50280,2")]
COST_TRACE = os.path.join(HERE, "data", "T65536_W1_star.jsonl")
STATES = ("idle", "drained", "poll", "rpc", "transfer", "params", "tail")


def synth(model, T, W, speed, bandwidth):
    spans = max(T // 16384, W)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run([sys.executable, os.path.join(HERE, "fleet_sim.py"), "synth",
                            "--model", model, "--T", str(T), "--chunk", "4096", "--spans",
                            str(spans), "--cost-trace", COST_TRACE, "--speed", str(speed),
                            "--bandwidth-gbps", str(bandwidth), "--workers", str(W),
                            "--reduce", "tree", "--owners", "round-robin", "--breakdown",
                            "--json", f.name], capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            raise SystemExit(2)
        out = json.load(open(f.name))
    row = next(x for x in out["rows"] if x["W"] == W)["tree"]
    return spans, row, out["critical_path_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="8,32,128", help="fleet sizes (default 8,32,128)")
    ap.add_argument("--T", default="1048576,4194304", help="tokens per step (default 1M, 4M)")
    ap.add_argument("--speed", type=float, default=500.0,
                    help="a worker's speed over the cost trace's (default 500)")
    ap.add_argument("--bandwidth-gbps", type=float, default=100.0,
                    help="each link direction (default 100)")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    rows = []
    print("| model | T | W | spans | step s | efficiency | coordinator bytes/step | "
          "what bounds it (below 0.70) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, model in SHAPES:
        for T in (int(x) for x in a.T.split(",")):
            for W in (int(x) for x in a.workers.split(",")):
                spans, r, cp = synth(model, T, W, a.speed, a.bandwidth_gbps)
                b, fleet = r["breakdown"], W * r["step_s"]
                top = sorted(STATES, key=lambda s: -b.get(s, 0.0))[:2]
                bound = "" if r["efficiency"] >= 0.70 else (
                    f"critical path {cp:.3g} s of the {r['step_s']:.3g} s step; worker-seconds "
                    + ", ".join(f"{s} {100 * b[s] / fleet:.0f}%" for s in top))
                print(f"| {name} | {T // 1024}K | {W} | {spans} | {r['step_s']:.4g} | "
                      f"{r['efficiency']:.2f} | {r['coord_bytes'] / 2**20:,.0f} MiB | {bound} |",
                      flush=True)
                rows.append({"model": name, "T": T, "W": W, "spans": spans,
                             "critical_path_s": cp, **r})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
