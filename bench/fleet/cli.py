# The command line: replay, calibrate and synth (the docstring of bench/fleet_sim.py describes
# them and the model), their flags, and the one-line errors (exit 2).

import argparse
import os
import sys

from . import breakdown
from .calibrate import fit_rows, lad_fit, lad_fit_held, parse_run, recorded_owners
from .cost import CostModel
from .errors import FleetError
from .net import Net
from .plan import SpanPlan, set_adjsh
from .shape import parse_shape
from .sim import Simulation, critical_path
from .sweep import modes_of, simulate, sweep, table, write_json
from .trace import carries_partials, check_deps, has_bytes, load_trace, trace_shape
from .wavefront import wavefront_tasks
from .workload import plan_tasks, trace_tasks


def cmd_replay(a):
    records, steps = load_trace(a.trace, a.step)
    shape = trace_shape(records, a.model)
    if a.speed <= 0:
        raise FleetError(f"--speed {a.speed}: must be positive")
    net = Net(a.latency_us, a.bandwidth_gbps, a.rpc_overhead_us, a.poll_ms, a.long_poll_ms)
    tasks = trace_tasks(records, shape, a.speed, a.param_bytes, a.chunk)
    S = records[0]["spans"]
    modes = modes_of(a.reduce)
    recorded = None
    if a.owners == "recorded":  # the trace's own span owners, at its own W
        recorded, seen = recorded_owners(records, S)
        if a.workers != [seen]:
            raise FleetError(f"--owners recorded: the trace's tasks ran on {seen} workers; give "
                             f"--workers {seen}")
    rows = sweep(a.workers, modes, lambda m, W: simulate(
        tasks, S, W, net, m, shape, owner=recorded if W > 1 else None,
        how="block" if recorded else a.owners, priority=a.priority), a.breakdown)
    total, cp = critical_path(tasks)
    try:
        diff = check_deps(records)
        note = diff and (f"note: the trace's dependencies are not SpanPlan's ({diff}); "
                         "replayed as recorded")
    except FleetError as e:  # no binary (or S, K it refuses): the replay needs no plan
        note = f"note: the trace's dependencies were not checked against SpanPlan's ({e})"
    print(f"replay {a.trace} step {records[0]['step']} ({len(steps)} steps in the file): "
          f"{len(tasks)} tasks, T={records[0]['T']}, S={S}, model {shape}, parameters "
          f"{(a.param_bytes or shape.param_bytes()) / 1e6:.1f} MB")
    print(f"task seconds {total:.4g} (speed {a.speed:g}), critical path {cp:.4g}, "
          f"parallelism {total / cp if cp else 0:.1f}; owners {a.owners}{schedule_note(a)}; "
          f"{net.describe()}")
    if note:
        print(note)
    print()
    print(table(rows, modes))
    if a.breakdown:
        paths = breakdown.critical_paths(tasks, net)
        print_breakdown(rows, modes, {m: paths for m in modes})
    write_json(a.json, {"mode": "replay", "trace": a.trace, "step": records[0]["step"],
                        "model": repr(shape), "speed": a.speed, "owners": a.owners,
                        **schedule_json(a), "net": net.describe(),
                        "task_seconds": total, "critical_path_s": cp, "rows": rows})


def cmd_calibrate(a):
    runs = []
    for text in a.trace:
        path, W, measured = parse_run(text)
        records, _ = load_trace(path, a.step)
        if not has_bytes(records):
            raise FleetError(f"{path}: an in-process trace (no byte counts) cannot calibrate "
                             "the link; record it with --workers")
        owner, seen = recorded_owners(records, records[0]["spans"])
        if seen != W:
            raise FleetError(f"{path}: given W={W}, the trace's tasks ran on {seen} workers")
        runs.append((path, W, measured, records, owner))
    rows = [row for _, _, _, recs, _ in runs for row in fit_rows(recs)]
    if a.bandwidth_gbps is not None:
        if a.bandwidth_gbps <= 0:
            raise FleetError(f"--bandwidth-gbps {a.bandwidth_gbps}: must be positive")
        x, bw_gbps = lad_fit_held(rows, 8e-3 / a.bandwidth_gbps), a.bandwidth_gbps  # s per MB
    else:
        x, inv_bw = lad_fit(rows)
        if inv_bw <= 0:
            raise FleetError("calibrate: the fitted time per byte is not positive; give traces "
                             "with larger results, or hold the link's --bandwidth-gbps")
        bw_gbps = 8e6 / inv_bw / 1e9
    overhead_us = (x - 2 * a.latency_us * 1e-6) * 1e6
    if overhead_us < 0:
        print(f"note: latency {a.latency_us} us already exceeds what the traces show; "
              "overhead set to 0")
        overhead_us = 0.0
    held = " (held)" if a.bandwidth_gbps is not None else ""
    print(f"fitted on {len(rows)} observations of {len(runs)} runs: --latency-us "
          f"{a.latency_us:g} (held) --rpc-overhead-us {overhead_us:.1f} --bandwidth-gbps "
          f"{bw_gbps:.3g}{held} --poll-ms {a.poll_ms:g} --long-poll-ms {a.long_poll_ms:g}")
    net = Net(a.latency_us, bw_gbps, overhead_us, a.poll_ms, a.long_poll_ms)
    print()
    print("| trace | W | tasks | task s | trace step s | measured s | predicted s | error |")
    print("|---|---|---|---|---|---|---|---|")
    out = []
    for path, W, measured, records, owner in runs:
        shape = trace_shape(records, a.model)
        tasks = trace_tasks(records, shape, 1.0, None, None)
        # a trace of a worker-tree run (its results carry no partials) replays as the tree
        mode = "star" if carries_partials(records) else "tree"
        r = simulate(tasks, records[0]["spans"], W, net, mode, shape, owner=owner)
        span = max(x["end_s"] for x in records)
        m = span if measured is None else measured
        err = (r.step_s - m) / m
        print(f"| {os.path.basename(path)} | {W} | {len(tasks)} | "
              f"{sum(t.time for t in tasks):.3f} | {span:.3f} | {m:.3f} | {r.step_s:.3f} | "
              f"{err * 100:+.1f}% |")
        out.append({"trace": path, "W": W, "measured_s": m, "trace_step_s": span,
                    "predicted_s": r.step_s, "relative_error": err})
    write_json(a.json, {"mode": "calibrate", "latency_us": a.latency_us,
                        "rpc_overhead_us": overhead_us, "bandwidth_gbps": bw_gbps,
                        "poll_ms": a.poll_ms, "long_poll_ms": a.long_poll_ms, "runs": out})


def cmd_synth(a):
    shape = parse_shape(a.model)
    if a.speed <= 0:
        raise FleetError(f"--speed {a.speed}: must be positive")
    plan = SpanPlan(a.T, a.chunk, a.spans, shape.K, shape.W)
    records, _ = load_trace(a.cost_trace, None)
    cost_shape = trace_shape(records, a.cost_model, "--cost-model")
    cost = CostModel.fit(records, cost_shape, a.cost_trace)
    net = Net(a.latency_us, a.bandwidth_gbps, a.rpc_overhead_us, a.poll_ms, a.long_poll_ms)
    P = shape.param_bytes()
    tasks = plan_tasks(plan, shape, lambda i, ph, k, s: cost.seconds(
        shape, ph, k, plan.ranges[s][1]) / a.speed, P)
    modes = modes_of(a.reduce)
    rows = sweep(a.workers, modes, lambda m, W: simulate(
        tasks, plan.S, W, net, m, shape, how=a.owners, priority=a.priority), a.breakdown)
    wave, forward = wavefront_tasks(shape, plan, cost, a.speed, a.wavefront_partials)
    wrows = sweep(a.workers, ["wavefront"], lambda m, W: Simulation(
        wave, [], W, net, "star", priority=a.priority).run(), a.breakdown)
    for row, w in zip(rows, wrows):
        row["wavefront"] = w["wavefront"]
    total, cp = critical_path(tasks)
    wtotal, wcp = critical_path(wave)
    print(f"synth {shape} ({shape.params() / 1e6:.1f}M parameters, {P / 1e6:.0f} MB), T={a.T}, "
          f"chunk {plan.C}, S={plan.S}: {len(tasks)} tasks; speed {a.speed:g} over {cost.source}")
    print(f"cost model (this machine): {cost.describe()}")
    print(f"span DAG: task seconds {total:.4g}, critical path {cp:.4g}, parallelism "
          f"{total / cp:.1f}; wavefront: forward on the coordinator {forward:.4g} s, then "
          f"{len(wave)} tasks ({wtotal:.4g} s, critical path {wcp:.4g} s), partials "
          f"{a.wavefront_partials}")
    print(f"owners {a.owners}{schedule_note(a)}; {net.describe()}")
    print()
    print(table(rows, modes + ["wavefront"]))
    if a.breakdown:
        paths = breakdown.critical_paths(tasks, net)
        print_breakdown(rows, modes + ["wavefront"], dict(
            {m: paths for m in modes}, wavefront=breakdown.critical_paths(wave, net)))
    write_json(a.json, {"mode": "synth", "model": repr(shape), "T": a.T, "chunk": plan.C,
                        "spans": plan.S, "speed": a.speed, "owners": a.owners,
                        **schedule_json(a), "net": net.describe(),
                        "cost_coef": cost.coef, "task_seconds": total, "critical_path_s": cp,
                        "parallelism": total / cp, "wavefront_forward_s": forward,
                        "rows": rows})


def schedule_note(a):
    """--priority where it is not the default, for the header line."""
    return "" if a.priority == "id" else f", priority {a.priority}"


def schedule_json(a):
    return {} if a.priority == "id" else {"priority": a.priority}


def print_breakdown(rows, modes, paths):
    print()
    print("Where the worker-seconds go (--breakdown):")
    print()
    print(breakdown.table(rows, modes, paths))


# ----------------------------------------------------------------------------------- CLI

def worker_list(text):
    try:
        ws = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected counts like 1,2,4,8") from None
    if not ws or min(ws) < 1 or max(ws) > 100000:
        raise argparse.ArgumentTypeError(f"{text!r}: counts from 1 to 100000")
    return ws


def add_net(p, latency, bandwidth, overhead):
    p.add_argument("--latency-us", type=float, default=latency,
                   help=f"one-way latency per message (default {latency:g})")
    if bandwidth is not None:
        p.add_argument("--bandwidth-gbps", type=float, default=bandwidth,
                       help=f"each link direction's bandwidth (default {bandwidth:g})")
        p.add_argument("--rpc-overhead-us", type=float, default=overhead,
                       help=f"fixed handling time per RPC (default {overhead:g}; calibrate "
                       "fits it)")
    p.add_argument("--poll-ms", type=float, default=20.0,
                   help="an idle worker's sleep after NoTask (the coordinator's retry_after_ms, "
                   "default 20)")
    p.add_argument("--long-poll-ms", type=float, default=100.0,
                   help="how long a PullTask waits for a task to become ready (the "
                   "coordinator's long_poll, default 100; 0: a coordinator without it)")


def add_owners(p, recorded=False):
    p.add_argument("--owners", choices=("block", "round-robin") + (("recorded",) if recorded
                                                                   else ()), default="block",
                   help="span s on worker s W // S (block, default) or s mod W (round-robin)" +
                   ("; recorded: the worker that ran most of its tasks in the trace (give "
                    "--workers as the trace's count)" if recorded else ""))
    p.add_argument("--priority", choices=("id", "critical-path"), default="id",
                   help="which of a worker's ready tasks it is given first: the lowest id (id, "
                   "as the coordinator leases; default) or the longest chain of task times from "
                   "it to the step's end (critical-path)")


REDUCE_HELP = ("where the partials are summed: star (every result carries its span's partials "
               "to the coordinator, which sends each worker the parameters), tree (the worker "
               "tree: the parameters relayed down a chain of the workers, worker i from worker "
               "i - 1, each group's partials summed up the span tree among them; adjsh "
               "--reduce tree), or both (default)")


def add_adjsh(p):
    p.add_argument("--adjsh", metavar="PATH",
                   help="the adjsh binary whose `adjsh plan` gives the span plan (default: "
                   "$ADJSH, or build/cli/adjsh in the repository)")


def add_breakdown(p):
    p.add_argument("--breakdown", action="store_true",
                   help="also print, per W, where the workers' seconds go (compute, waiting for "
                   "dependencies, polling, RPCs, transfers, the reduction's tail) and the "
                   "critical path")


def parser():
    top = argparse.ArgumentParser(
        prog="fleet_sim.py", description="Predict a span-scheduled gradient step on W workers "
        "(star or tree reduction) from a recorded trace or a model shape.",
        epilog="Run 'fleet_sim.py COMMAND --help' for a command's flags; the file's docstring "
        "describes the model.")
    sub = top.add_subparsers(dest="cmd", metavar="COMMAND", required=True)

    r = sub.add_parser("replay", help="replay a recorded trace on W simulated workers",
                       description="Replay one step of an `adjsh ... --trace` file on W "
                       "simulated workers.")
    r.add_argument("--trace", required=True, help="trace file (JSON lines)")
    r.add_argument("--step", type=int, help="the step to replay (default: the lowest)")
    r.add_argument("--workers", type=worker_list, default=[1, 2, 4, 8, 16, 32, 64],
                   help="worker counts, e.g. 1,2,4,8 (default 1,2,...,64)")
    add_net(r, 10.0, 100.0, 50.0)
    r.add_argument("--speed", type=float, default=1.0, help="divide recorded task times by this")
    r.add_argument("--reduce", choices=("star", "tree", "both"), default="both", help=REDUCE_HELP)
    add_owners(r, recorded=True)
    g = r.add_mutually_exclusive_group()
    g.add_argument("--param-bytes", type=int, help="parameter bytes (default: from the shape)")
    g.add_argument("--model", help="D,K,N,V,E of the traced model (default: inferred from "
                   "the byte counts)")
    r.add_argument("--chunk", type=int, help="the traced chunk (only for in-process traces)")
    add_adjsh(r)
    add_breakdown(r)
    r.add_argument("--json", help="also write the numbers here")

    c = sub.add_parser("calibrate", help="fit the local link model to recorded runs",
                       description="Fit the per-RPC overhead and bandwidth of the local link to "
                       "traces, then compare predicted and measured steps.")
    c.add_argument("--trace", action="append", required=True, metavar="FILE:W[:SECONDS]",
                   help="a trace, its worker count and its measured step (repeatable)")
    c.add_argument("--step", type=int, help="the step of each trace (default: the lowest)")
    c.add_argument("--model", help="D,K,N,V,E (default: inferred from the byte counts)")
    add_net(c, 5.0, None, None)
    c.add_argument("--bandwidth-gbps", type=float,
                   help="hold each link direction's bandwidth (a link of known rate; needed "
                   "where the tasks' own bytes are too few and too alike to fit it) and fit "
                   "the per-RPC overhead alone")
    c.add_argument("--json", help="also write the numbers here")

    s = sub.add_parser("synth", help="simulate a plan synthesized for a model shape",
                       description="Build the plan for a shape, time its tasks with a cost "
                       "model fitted on a real trace, and simulate star, tree and wavefront.")
    s.add_argument("--model", required=True, help="D,K,N,V,E, e.g. 768,24,16,50280,2")
    s.add_argument("--T", type=int, required=True, help="tokens per step")
    s.add_argument("--chunk", type=int, required=True, help="tokens per chunk")
    s.add_argument("--spans", type=int, default=0, help="spans (default: SpanPlan's)")
    s.add_argument("--cost-trace", required=True, help="a real trace to fit the cost model on")
    s.add_argument("--cost-model", help="D,K,N,V,E of the cost trace's model (default: "
                   "inferred from its byte counts)")
    s.add_argument("--speed", type=float, required=True,
                   help="how much faster a worker is than the cost trace's (e.g. GPU over CPU)")
    s.add_argument("--workers", type=worker_list, default=[1, 2, 4, 8, 16, 32, 64])
    add_net(s, 10.0, 100.0, 50.0)
    s.add_argument("--reduce", choices=("star", "tree", "both"), default="both", help=REDUCE_HELP)
    add_owners(s)
    s.add_argument("--wavefront-partials", choices=("task", "none"), default="task",
                   help="the wavefront's tasks return their layer's partial (task, as it "
                   "shipped) or not (none)")
    add_adjsh(s)
    add_breakdown(s)
    s.add_argument("--json", help="also write the numbers here")
    return top


def main(argv=None):
    a = parser().parse_args(argv)
    set_adjsh(getattr(a, "adjsh", None))
    try:
        {"replay": cmd_replay, "calibrate": cmd_calibrate, "synth": cmd_synth}[a.cmd](a)
    except FleetError as e:
        print(f"fleet_sim.py {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
