# The span plan of one step, as the binary makes it: `adjsh plan` (cli/plan_cmd.cc, which
# describes its JSON) prints engine/span_plan.cc's plan, and this module reads it, so the
# simulator has no plan of its own: the spans' token ranges, the chunks, the task ids in
# preference order and every task's dependencies are SpanPlan's.
#
# The binary: the `adjsh` argument, else set_adjsh(PATH) (fleet_sim.py --adjsh), else $ADJSH,
# else build/cli/adjsh in the repository.

import functools
import json
import os
import subprocess

from .errors import FleetError


PHASES = ("fwd_summary", "fwd", "bwd_summary", "bwd")   # SpanPhaseName, in SpanPhase order
FWD_SUMMARY, FWD, BWD_SUMMARY, BWD = PHASES
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_ADJSH = os.path.join(ROOT, "build", "cli", "adjsh")

_adjsh = None  # set_adjsh's path


class AdjshMissing(FleetError):
    """No usable adjsh binary to ask for the plan."""


def set_adjsh(path):
    """The binary every plan comes from from now on (None: $ADJSH, or build/cli/adjsh)."""
    global _adjsh
    _adjsh = os.path.abspath(path) if path else None


def adjsh_path(adjsh=None):
    return adjsh or _adjsh or os.environ.get("ADJSH") or DEFAULT_ADJSH


def _run_plan(adjsh, args):
    if not (os.path.isfile(adjsh) and os.access(adjsh, os.X_OK)):
        raise AdjshMissing(f"no adjsh binary at {adjsh} to make the span plan: build it with "
                           "scripts/build.sh, or give its path (--adjsh PATH or $ADJSH)")
    try:
        p = subprocess.run([adjsh, "plan", *args], capture_output=True, text=True)
    except OSError as e:
        raise AdjshMissing(f"cannot run {adjsh}: {e.strerror}") from None
    if p.returncode != 0:
        err = p.stderr.strip()
        if "unknown command 'plan'" in err:
            raise AdjshMissing(f"{adjsh} has no 'plan' command: rebuild it with scripts/build.sh")
        # "adjsh plan: error: MESSAGE": the message alone (it names the flag)
        msg = err.splitlines()[0] if err else f"exit {p.returncode}"
        raise FleetError(msg.split("error: ", 1)[-1])
    try:
        return json.loads(p.stdout)
    except ValueError:
        raise FleetError(f"{adjsh} plan {' '.join(args)}: not a JSON plan") from None


def plan_json(T, chunk, spans, K, W=4, forward_only=False, adjsh=None):
    """The JSON object `adjsh plan` prints for this shape (shared between calls: do not change
    it). FleetError with the binary's message for a shape it refuses."""
    return _plan_json(adjsh_path(adjsh), T, chunk, spans, K, W, bool(forward_only))


@functools.lru_cache(maxsize=256)
def _plan_json(adjsh, T, chunk, spans, K, W, forward_only):
    """Cached: a plan is a function of its shape and the binary alone."""
    args = ["--context", str(T), "--chunk", str(chunk), "--spans", str(spans), "--layers", str(K),
            "--conv-kernel", str(W)] + (["--forward-only"] if forward_only else [])
    return _run_plan(adjsh, args)


def default_spans(T, chunk, W=4, adjsh=None):
    """SpanPlan::DefaultSpans(T, chunk, W): the spans of the binary's plan with --spans 0."""
    return plan_json(T, chunk, 0, 1, W, adjsh=adjsh)["num_spans"]


class SpanPlan:
    """The binary's plan of one step (engine/span_plan.h). T, C (the chunk, clamped to T), nC
    chunks, S spans, K layers, W conv kernel; ranges[s] = (t0, len, halo) with halo =
    min(W - 1, t0); chunks[c] the same for chunk c; tasks[id] = (phase, layer, span); deps[id]
    sorted, all lower ids."""

    def __init__(self, T, chunk, spans, K, W=4, forward_only=False, adjsh=None):
        for name, v in (("T", T), ("chunk", chunk), ("spans", spans), ("K", K), ("W", W)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise FleetError(f"span plan: {name}={v!r} is not an integer")
        j = plan_json(T, chunk, spans, K, W, bool(forward_only), adjsh)
        self.T, self.C, self.nC, self.S = j["T"], j["chunk"], j["num_chunks"], j["num_spans"]
        self.K, self.W, self.forward_only = j["layers"], j["conv_kernel"], j["forward_only"]
        if tuple(j["phases"]) != PHASES:
            raise FleetError(f"the binary's phases {j['phases']} are not {list(PHASES)}")
        self.ranges = [(r["t0"], r["len"], r["halo"]) for r in j["spans"]]
        self.span_chunks = [(r["c0"], r["c1"]) for r in j["spans"]]
        self._first = [r["first_task"] for r in j["spans"]]
        self.chunks = [(c["t0"], c["len"], c["halo"]) for c in j["chunks"]]
        self.tasks = [(t["phase"], t["layer"], t["span"]) for t in j["tasks"]]
        self.deps = [list(t["deps"]) for t in j["tasks"]]
        if [t["id"] for t in j["tasks"]] != list(range(len(self.tasks))):
            raise FleetError("the binary's plan lists its tasks out of id order")
        self.index = {t: i for i, t in enumerate(self.tasks)}

    def id(self, phase, k, s):
        return self.index.get((phase, k, s), -1)

    def first_task_of_span(self, s):
        """The span's first task (its lowest id), which fetches its tokens."""
        return self._first[s]
