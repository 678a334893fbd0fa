# The span schedule's tasks as the simulator takes them (SimTasks): from a synthesized plan (times
# from a cost model, bytes from the tensor shapes) or from a recorded trace (its times, its
# dependencies, its bytes less the parameters and partials).

from .errors import FleetError
from .plan import SpanPlan
from .sim import SimTask
from .trace import carries_partials, has_bytes
from .wire import input_bytes, output_bytes, partial_bytes, span_start_bytes


def plan_tasks(plan, shape, seconds_of, param_bytes):
    """SimTasks of a plan with bytes from the tensor shapes: seconds_of(id, phase, layer,
    span) gives each task's time. The span's tokens go with its first task."""
    firsts = {plan.first_task_of_span(s): s for s in range(plan.S)}
    tasks = []
    for i, (phase, k, s) in enumerate(plan.tasks):
        part = partial_bytes(shape, (phase, k, s))
        b_in = input_bytes(shape, plan, (phase, k, s))
        if i in firsts:
            b_in += span_start_bytes(plan, s)
        b_out = output_bytes(shape, plan, (phase, k, s)) - sum(part.values())
        tasks.append(SimTask(i, s, k, plan.deps[i], seconds_of(i, phase, k, s), b_in, b_out,
                             part, "all", param_bytes))
    return tasks


def recorded_param_fetches(records, P):
    """Ids of the tasks whose recorded bytes_in carried the parameters: each worker's first
    task (by lease time) when it fetched at least P bytes."""
    first = {}
    for r in sorted(records, key=lambda r: (r["start_s"], r["id"])):
        first.setdefault(r["worker"], r)
    return {r["id"] for r in first.values() if r["bytes_in"] >= P}


def trace_tasks(records, shape, speed, param_bytes, chunk):
    """SimTasks of a recorded step: times from the trace, deps from the trace, bytes from the
    trace less the parameters and partials where it carried them (a worker-tree run's results
    carry no partials and its fetches no parameters), or with no byte counts from the shapes.
    Either way each task has its partials and its worker the parameters to fetch, for the star
    or the tree to move as simulated."""
    T, S, K = records[0]["T"], records[0]["spans"], shape.K
    P = shape.param_bytes() if param_bytes is None else param_bytes
    if has_bytes(records):
        fetched = recorded_param_fetches(records, P)
        in_result = carries_partials(records)  # a worker-tree run's results carry none
        tasks = []
        for r in records:
            task = (r["phase"], r["layer"], r["span"])
            part = partial_bytes(shape, task)
            b_in = r["bytes_in"] - (P if r["id"] in fetched else 0)
            b_out = max(0, r["bytes_out"] - (sum(part.values()) if in_result else 0))
            tasks.append(SimTask(r["id"], r["span"], r["layer"], list(r["deps"]),
                                 (r["compute_s"] + r["rebuild_s"]) / speed, max(0, b_in), b_out,
                                 part, "all", P))
        return tasks
    if not chunk:
        raise FleetError("this trace has no byte counts (an in-process run): pass --chunk C "
                         "(with --model) to price its transfers")
    plan = SpanPlan(T, chunk, S, K, shape.W)
    tasks = plan_tasks(plan, shape, lambda i, *_: (records[i]["compute_s"] +
                                                    records[i]["rebuild_s"]) / speed, P)
    for t, r in zip(tasks, records):
        t.deps = list(r["deps"])
    return tasks
