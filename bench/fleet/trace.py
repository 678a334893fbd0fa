# Recorded task traces (`adjsh grad|train --trace FILE`, engine/step_profile.h): reading one
# step, the model shape inferred from the result sizes, and whether the recorded dependencies
# are SpanPlan's.

import json
from collections import defaultdict

from .errors import FleetError
from .plan import PHASES, FWD_SUMMARY, FWD, BWD_SUMMARY, BWD, SpanPlan
from .shape import F32, Shape, parse_shape
from .wire import DEVICE_TRAFFIC_BYTES, HEAD_SCALAR_BYTES, TIMING_BYTES


REQUIRED = ("step", "id", "phase", "layer", "span", "deps", "start_s", "end_s", "compute_s",
            "rebuild_s", "worker", "bytes_in", "bytes_out", "T", "spans")


def load_trace(path, step=None):
    """The records of one step of a trace file (the lowest step unless `step`), by id."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        raise FleetError(f"{path}: {e.strerror}") from None
    steps = defaultdict(dict)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:
            raise FleetError(f"{path}:{n}: not a JSON object") from None
        if not isinstance(r, dict) or any(k not in r for k in REQUIRED):
            missing = [k for k in REQUIRED if not isinstance(r, dict) or k not in r]
            raise FleetError(f"{path}:{n}: not a task trace line (missing {', '.join(missing)})")
        if r["phase"] not in PHASES:
            raise FleetError(f"{path}:{n}: unknown phase {r['phase']!r}")
        if r["id"] in steps[r["step"]]:
            raise FleetError(f"{path}:{n}: step {r['step']} task {r['id']} appears twice (two "
                             "runs appended to one file? use one file per run)")
        steps[r["step"]][r["id"]] = r
    if not steps:
        raise FleetError(f"{path}: no task records")
    chosen = min(steps) if step is None else step
    if chosen not in steps:
        raise FleetError(f"{path}: no step {chosen} (steps: {', '.join(map(str, sorted(steps)))})")
    recs = steps[chosen]
    ids = sorted(recs)
    if ids != list(range(len(ids))):
        raise FleetError(f"{path}: step {chosen} has tasks {ids[0]}..{ids[-1]} with gaps")
    out = [recs[i] for i in ids]
    for r in out:
        if any(d >= r["id"] or d < 0 for d in r["deps"]):
            raise FleetError(f"{path}: task {r['id']} depends on a task at or after it")
    return out, sorted(steps)


def trace_layers(records):
    return 1 + max(r["layer"] for r in records)


def has_bytes(records):
    return any(r["bytes_in"] or r["bytes_out"] for r in records)


def carries_partials(records):
    """Whether the results carry the parameter partials (a star run; a worker-tree run's do
    not): bwd(K-1, 0) returns no rows (span 0 has no halo), only its timings and the layer's
    partial."""
    K = trace_layers(records)
    out = [r["bytes_out"] for r in records
           if r["phase"] == BWD and r["layer"] + 1 == K and r["span"] == 0]
    return not out or max(out) > TIMING_BYTES


def infer_shape(records, flag="--model"):
    """D, K, N, V, E from a worker trace's result sizes (conv W = 4, R = ceil(D/16)): m is
    (Di, N); sigma + h_end is (Di) + (Di, N); halo_next (3, D); the head's (V, D) + (D). Each
    result also carries TIMING_BYTES, or 48 fewer in traces recorded before results carried
    their device traffic (bench/data/T65536_W1_star.jsonl)."""
    K = trace_layers(records)
    size = defaultdict(list)
    for r in records:
        size[(r["phase"], r["layer"] + 1 == K, r["span"] == 0)].append(r["bytes_out"])
    def one(key):
        return max(size[key]) if size[key] else None
    for timing in (TIMING_BYTES, TIMING_BYTES - DEVICE_TRAFFIC_BYTES):
        try:
            DiN = (one((BWD_SUMMARY, True, False)) - timing) // F32
            Di = (one((FWD_SUMMARY, K == 1, True)) - timing) // F32 - DiN
            if K > 1:
                D = (one((FWD, False, True)) - timing) // (3 * F32)
            else:  # du_halo_prev (3, D) of a later span over span 0's none
                D = (one((BWD, True, False)) - one((BWD, True, True))) // (3 * F32)
            V = (one((FWD, True, True)) - timing - HEAD_SCALAR_BYTES) // (F32 * D) - 1
            shape = Shape(D, K, DiN // Di, V, Di // D)
        except (TypeError, ZeroDivisionError, FleetError):
            continue
        # check: bwd(K-1, 0) (or bwd(0, 0)) returns exactly the layer's partial (+ embedding)
        if shape.Di == Di and shape.Di * shape.N == DiN:
            want = timing + F32 * shape.layer_params() + (F32 * shape.embed_params()
                                                          if K == 1 else 0)
            if one((BWD, True, True)) == want:
                return shape
    if not carries_partials(records):
        raise FleetError("this trace's results carry no parameter partials (a worker-tree "
                         "run), so its byte counts do not give the model shape; pass "
                         f"{flag} D,K,N,V,E")
    raise FleetError(f"cannot infer the model shape from the trace's byte counts; pass {flag} "
                     "D,K,N,V,E")


def trace_shape(records, model_flag, flag="--model"):
    """The shape given by `flag` (its value model_flag), or inferred from the byte counts."""
    K = trace_layers(records)
    if model_flag:
        shape = parse_shape(model_flag, flag)
        if shape.K != K:
            raise FleetError(f"{flag} has K={shape.K} layers, the trace {K}")
        return shape
    if not has_bytes(records):
        raise FleetError(f"this trace has no byte counts (an in-process run): pass {flag} "
                         "D,K,N,V,E" + (" and --chunk C to price its transfers"
                                        if flag == "--model" else ""))
    return infer_shape(records, flag)


def check_deps(records):
    """None when the trace's deps are SpanPlan's for its S and K, else the first difference
    (AdjshMissing without a binary to make the plan)."""
    S, K = records[0]["spans"], trace_layers(records)
    plan = _deps_plan(S, K)
    if len(plan.tasks) != len(records):
        return f"{len(records)} tasks, the plan for S={S} K={K} has {len(plan.tasks)}"
    for r in records:
        if (r["phase"], r["layer"], r["span"]) != plan.tasks[r["id"]] or \
                sorted(r["deps"]) != plan.deps[r["id"]]:
            return f"task {r['id']} differs from SpanPlan's"
    return None


def _deps_plan(S, K):
    """A plan with S spans and K layers (dependencies do not depend on T or the chunk)."""
    return SpanPlan(S * 4, 4, S, K)
