# Where a simulated step's worker-seconds go (--breakdown): each worker's time from the step's
# start to its end, W x step in all, split by what the worker was doing (Simulation.account),
# beside the DAG's critical path and the bound max(task seconds / W, critical path).

STATES = (  # (state, column, what it is)
    ("compute", "compute", "running tasks"),
    ("idle", "deps idle", "no task of its ready: waiting for other workers' results"),
    ("drained", "drained", "after its last task, while other workers still compute"),
    ("poll", "poll wait", "a task of its ready, its PullTask asleep between long polls"),
    ("rpc", "rpc", "per task: lease reply + FetchInputs request, the result's handling, "
     "PushResult's reply + the next PullTask (4 latencies + 3 overheads)"),
    ("transfer", "transfers", "its inputs down and its result up: latency, waiting for the "
     "links, bytes / bandwidth"),
    ("params", "param wait", "tree: its first task waiting for the worker's parameter copy "
     "(FetchParams from worker i - 1 of the chain, worker 0's from the coordinator) and the "
     "FetchInputs request after it"),
    ("tail", "tail", "after the last task's result, until the step ends (tree: the last sums "
     "going up the tree)"),
)


def critical_paths(tasks, net):
    """(task seconds, the DAG's critical path by task times from their release, the same with
    each task's least cost on the wire: 4 latencies + 2 overheads + its bytes in and out (no
    parameters, no partials) / bandwidth)."""
    finish = [0.0] * len(tasks)
    wired = [0.0] * len(tasks)
    for t in tasks:
        finish[t.id] = max([t.release] + [finish[d] for d in t.deps]) + t.time
        wired[t.id] = (max([t.release] + [wired[d] for d in t.deps]) + t.time + 4 * net.lat
                       + 2 * net.ovh + (t.bytes_in + t.bytes_out) / net.bw)
    return (sum(t.time for t in tasks), max(finish, default=0.0), max(wired, default=0.0))


def of_result(r):
    """{state: worker-seconds} of a simulated step, summed over its workers."""
    out = {s: 0.0 for s, _, _ in STATES}
    for acc in r.worker_time:
        for s, v in acc.items():
            out[s] = out.get(s, 0.0) + v
    return out


def table(rows, modes, paths):
    """One row per (W, mode): worker-seconds of each state and its share of W x step, then the
    critical paths and the bound. paths: {mode: (task seconds, critical path, with wire)}."""
    cols = ["W", "mode", "step s", "W x step"] + [c for _, c, _ in STATES] + [
        "critical path s", "+ wire s", "bound s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        W = row["W"]
        for m in modes:
            v = row[m]
            b, fleet = v["breakdown"], W * v["step_s"]
            total, cp, wired = paths[m]
            cells = [str(W), m, f"{v['step_s']:.4g}", f"{fleet:.4g}"]
            cells += [f"{b[s]:.3g} ({100 * b[s] / fleet:.1f}%)" if fleet else "0"
                      for s, _, _ in STATES]
            cells += [f"{cp:.4g}", f"{wired:.4g}", f"{max(total / W, cp):.4g}"]
            lines.append("| " + " | ".join(cells) + " |")
    legend = ["", "worker-seconds (share of W x step) by state:"]
    legend += [f"  {c:<11} {what}" for _, c, what in STATES]
    legend += ["  critical path: the DAG's longest chain by task times (the wavefront's from the "
               "end of the coordinator's forward); + wire: with each task's least RPC and "
               "transfer cost; bound: max(task seconds / W, critical path)"]
    return "\n".join(lines + legend)
