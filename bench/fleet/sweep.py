# Sweeping the fleet size: one simulated step per (reduction, W), speed-up and parallel efficiency
# against each mode's own W = 1, and the markdown table and JSON of the results.

import json

from .breakdown import of_result
from .errors import FleetError
from .sim import Simulation, block_owners
from .wire import tree_groups


def simulate(tasks, S, W, net, mode, shape=None, owner=None, how="block", priority="id"):
    """One step: the star, or the worker tree (its groups' bytes from the shape when given; the
    parameter copy is the tasks' param_bytes)."""
    owner = owner or (block_owners(S, W, how) if S else [])
    if mode == "tree":
        return Simulation(tasks, owner, W, net, "tree", tree_groups(shape) if shape else None,
                          priority).run()
    return Simulation(tasks, owner, W, net, "star", priority=priority).run()


def sweep(workers, modes, run_one, breakdown=False):
    """Rows per W: {mode: {step_s, speedup, efficiency, util, coord_busy, ...}}; speed-ups
    over each mode's own W = 1 (simulated even when not asked for). With breakdown, each mode
    also has "breakdown": {state: worker-seconds} (breakdown.py)."""
    base = {m: run_one(m, 1) for m in modes}
    rows = []
    for W in workers:
        row = {"W": W}
        for m in modes:
            r = base[m] if W == 1 else run_one(m, W)
            speedup = base[m].step_s / r.step_s
            row[m] = {"step_s": r.step_s, "speedup": speedup, "efficiency": speedup / W,
                      "util": r.compute_s / (W * r.step_s), "coord_busy": r.coord_busy,
                      "coord_bytes": r.coord_bytes, "worker_max_bytes": r.worker_max_bytes}
            if breakdown:
                row[m]["breakdown"] = of_result(r)
        rows.append(row)
    return rows


def table(rows, modes):
    cols = ["step s", "speed-up", "eff", "util", "coord busy"]
    head = "| W | " + " | ".join(f"{m} {c}" for m in modes for c in cols) + " |"
    lines = [head, "|" + "---|" * (1 + len(cols) * len(modes))]
    for row in rows:
        cells = [str(row["W"])]
        for m in modes:
            v = row[m]
            cells += [f"{v['step_s']:.4g}", f"{v['speedup']:.2f}", f"{v['efficiency']:.2f}",
                      f"{v['util']:.2f}", f"{v['coord_busy']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(path, obj):
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
    except OSError as e:
        raise FleetError(f"--json {path}: {e.strerror}") from None


def modes_of(reduce):
    return ["star", "tree"] if reduce == "both" else [reduce]
