#!/usr/bin/python3
"""Fleet simulation of one span-scheduled gradient step (docs/ARCHITECTURE.md "Spans",
../shared/DESIGN.md section 7): how long a step takes on W workers, from a recorded task trace
(`adjsh grad|train --trace FILE`) or from a plan synthesized for a model shape, with the
coordinator's reduction as built (a star) or as DESIGN.md section 7 describes it (a binary tree
among the workers), side by side. Python 3 standard library only.

Letters: T tokens, C chunk, S spans, K layers, D width, Di = E D inner, N state, R = ceil(D/16)
dt rank, W conv kernel (4), V vocabulary; "W workers" is the fleet size.

WHAT IT MODELS
  Plan       engine/span_plan.cc mirrored exactly (task ids, dependencies; the tests compare it
             with real traces): per layer fwd_summary(k, s) for s < S-1 and fwd(k, s), then
             per layer from the top bwd_summary(k, s) for s > 0 and bwd(k, s).
  Owners     span s runs on worker s W // S (--owners block, contiguous) or s mod W
             (--owners round-robin, how the coordinator now deals spans nobody holds);
             calibrate uses the recorded owners. A worker runs its own ready tasks one at a
             time, lowest id first.
  A task     as a worker serves it (worker/worker.cc, coordinator/task_service.cc): PullTask
             (lease), FetchInputs (its inputs down), compute, PushResult (its results up).
             Each RPC costs --latency-us each way plus --rpc-overhead-us (coordinator and gRPC
             handling, a fixed delay per RPC, not a shared resource); a result counts when it
             has reached the coordinator, and a task is ready when every dependency's has.
             A PullTask with nothing ready for its worker waits up to --long-poll-ms (the
             coordinator's long_poll, 100) and leases the moment a task becomes ready; after
             that NoTask, the worker sleeps --poll-ms (retry_after_ms, 20) and asks again, so a
             task that becomes ready in that gap waits for the next PullTask. The step starts in
             the middle of every worker's long poll (without one: of its poll interval).
  Links      every transfer costs latency + bytes / bandwidth; each worker has one full-duplex
             link, the coordinator one, each direction a FIFO server at --bandwidth-gbps; a
             coordinator <-> worker transfer holds both links' directions for the same interval.
  star       the system as built: all parameters (f32) go to each worker with its first fetch,
             every task's result (with its span's partials: layer k's gradient with bwd(k, s),
             the (V, D) embedding partial with bwd(0, s) and the LM head's with fwd(K-1, s))
             goes to the coordinator.
  tree       DESIGN.md section 7: the parameters come down a binary tree of the workers in
             pieces (embedding, layer 0, ..., layer K-1; a task waits for its layer's piece),
             and per layer (plus one group for the embedding and head partials) each worker
             sums its spans' partials itself; the owner of a right node streams its sum to the
             owner of the left one, which adds it and passes it up; the root sends it to the
             coordinator. Each hop is store-and-forward of one sum; layer k's reduction overlaps
             the backward of layer k-1 (it starts when a worker's last bwd(k, s) ends). The
             coordinator's link carries O(parameters) per step, worker 0's O(parameters log2 W).
             Summing partials costs nothing here.
  wavefront  (synth only) the retired schedule: the coordinator runs the whole forward and
             the LM head itself, serially at one worker's speed; then backward tasks (k, c),
             one per layer and chunk, (k, c) needing (k+1, c) and (k, c+1) (so at most K run at
             once), handed to any idle worker; each fetches u (halo + C, D) and g (C, D) plus
             h0 and mu (Di, N) and, once per worker, the layer's parameters, and returns
             du (C, D), du_halo, mu_out and (--wavefront-partials task, as it shipped) the
             layer's gradient partial.

WHAT IT IGNORES
  contention on a worker (its CPU or GPU shared with others: recorded task times already carry
  what the recorded run had), the coordinator's own CPU time beyond --rpc-overhead-us, the
  combines (O(S Di N)), heartbeats, leases expiring and faults, the cost of adding partials,
  stream piece boundaries, TCP/gRPC flow control, and task times varying with who runs them.

COMMANDS
  fleet_sim.py replay --trace FILE [--step N] --workers 1,2,4,...,64 [--latency-us L]
      [--bandwidth-gbps B] [--rpc-overhead-us O] [--poll-ms P] [--long-poll-ms L] [--speed F]
      [--reduce star|tree|both] [--owners block|round-robin] [--param-bytes P | --model
      D,K,N,V,E] [--chunk C] [--json FILE]
    Replays the recorded tasks (compute_s + rebuild_s, divided by --speed) with the recorded
    "deps", on W simulated workers. The model shape (for the parameter bytes and which result
    bytes are partials) is --model, or inferred from the trace's byte counts (conv W = 4,
    R = ceil(D/16)); an in-process trace has no byte counts: give --model and --chunk, and the
    bytes come from the tensor shapes (engine/span_tensors.h).
  fleet_sim.py calibrate --trace FILE:W[:SECONDS] [...] [--latency-us L] [--poll-ms P]
      [--long-poll-ms L] (0 for traces of a coordinator without the long poll)
    Fits --rpc-overhead-us and --bandwidth-gbps of the local link (Unix sockets on one host;
    the latency is held at --latency-us, 5 by default, since on one host only latency plus
    overhead is seen) to the recorded tasks: each task's leased-to-accepted time less its
    compute is 4 latencies + 2 overheads + bytes / bandwidth, and the gap from one result to
    the next lease of a task that was ready is 2 latencies + 1 overhead (a least-absolute-
    deviations fit, robust to descheduled processes). Then it replays each trace at its
    recorded W with its recorded owners and prints measured against predicted step seconds.
    SECONDS is the measured step; without it, the trace's own (its last acceptance).
  fleet_sim.py synth --model D,K,N,V,E --T T --chunk C [--spans S] --cost-trace FILE
      [--cost-model D,K,N,V,E] --speed F [--bandwidth-gbps B] [--latency-us L]
      [--rpc-overhead-us O] [--poll-ms P] [--long-poll-ms L] --workers 1,2,...,64
      [--reduce both] [--owners block|round-robin] [--wavefront-partials task|none] [--json FILE]
    Builds the plan for the shape, gives each task a time from a cost model fitted on
    --cost-trace (a real trace of a smaller model on this machine: per phase, seconds per token
    per FLOP of the phase, FLOPs from the shape as below; the LM head separately, from what the
    top layer's fwd takes beyond a layer's forward) divided by --speed, and each task its bytes
    from the tensor shapes; then simulates as replay does, and the wavefront beside it.
    FLOPs per token and layer: GEMMs 2 m n k (bench/flops.h): in_proj 4 D Di, x_proj
    2 Di (R + 2N), dt_proj 2 R Di, out_proj 2 Di D; a scan pass 8 Di N.
      fwd_summary  in_proj + x_proj + dt_proj + one scan          (no out_proj)
      fwd          fwd_summary + out_proj; at k = K-1 plus the head 3 x 2 V D
      bwd_summary  in_proj + x_proj + dt_proj + out_proj (ybar) + one (adjoint) scan
      bwd          3 x (all four GEMMs: the recompute, then dW and dinput) + three scans

OUTPUT
  A markdown table, one row per W, for each of star, tree (and wavefront for synth):
    step s      predicted seconds from the step's start to its last result (star) or to the
                last sum reaching the coordinator (tree)
    speed-up    that mode's W = 1 step over this one
    eff         parallel efficiency = speed-up / W
    util        the workers' compute seconds / (W x step): how busy the fleet is
    coord busy  the busier direction of the coordinator's link: busy seconds / step
  --json FILE writes the same numbers (and the settings, bytes per link) as one JSON object.
  synth also prints the DAG's parallelism (task seconds / critical path). Exit 0; a bad flag or
  file: a message on stderr and exit 2.
"""
import argparse
import heapq
import json
import math
import os
import sys
from collections import defaultdict

PHASES = ("fwd_summary", "fwd", "bwd_summary", "bwd")
FWD_SUMMARY, FWD, BWD_SUMMARY, BWD = PHASES
F32 = 4                   # bytes per value: every tensor on the wire is f32 (I64 tokens: 8)
TIMING_BYTES = 16         # "compute_seconds" and "rebuild_seconds", F64 each, in every result
HEAD_SCALAR_BYTES = 16    # "loss_sum" F64 and "correct" I64 with fwd(K-1, s)
SCAN_FLOPS = 8            # per (channel, state) per token, per scan pass
TOKENS_PER_SPAN = 16384   # SpanPlan::DefaultSpans: one span per this many tokens
MIN_DEFAULT_SPANS = 8
EMBED = "embed"           # the reduction group of the embedding and LM head partials


class FleetError(Exception):
    """A user error (bad flag, file or trace): printed as one line, exit 2."""


# ----------------------------------------------------------------------------- model shape

class Shape:
    """A Hugging Face Mamba shape: D width, K layers, N state, V vocab, E expand, W conv."""

    def __init__(self, D, K, N, V, E, W=4):
        if min(D, K, N, V, E, W) < 1:
            raise FleetError(f"model shape D={D} K={K} N={N} V={V} E={E} must be positive")
        self.D, self.K, self.N, self.V, self.E, self.W = D, K, N, V, E, W
        self.Di = E * D
        self.R = -(-D // 16)  # time_step_rank "auto" = ceil(D / 16)

    def __repr__(self):
        return f"D={self.D},K={self.K},N={self.N},V={self.V},E={self.E}"

    def layer_params(self):
        """Values of one layer: norm (D), in_proj (2Di, D), conv1d (Di, 1, W) + bias (Di),
        x_proj (R + 2N, Di), dt_proj (Di, R) + bias (Di), A_log (Di, N), D (Di),
        out_proj (D, Di)."""
        D, Di, N, R, W = self.D, self.Di, self.N, self.R, self.W
        return (D + 2 * Di * D + Di * W + Di + (R + 2 * N) * Di + Di * R + Di + Di * N + Di
                + D * Di)

    def embed_params(self):
        return self.V * self.D  # (V, D), tied with the LM head

    def params(self):
        return self.embed_params() + self.K * self.layer_params() + self.D  # + norm_f (D)

    def param_bytes(self):
        return F32 * self.params()


def parse_shape(text, flag="--model"):
    try:
        D, K, N, V, E = (int(x) for x in text.split(","))
    except ValueError:
        raise FleetError(f"{flag} {text!r}: expected D,K,N,V,E, five integers "
                         "(e.g. 768,24,16,50280,2)") from None
    return Shape(D, K, N, V, E)


# ---------------------------------------------------------------- span plan (span_plan.cc)

def first_chunk(s, S, nC):
    """Span s of S over nC chunks starts at chunk s nC / S (as even as whole chunks go)."""
    return s * nC // S


def short_span(T, C, S, W):
    """The first span after span 0 (and before the last) shorter than the next one's conv halo
    (W - 1 rows), or -1."""
    nC = -(-T // C)
    for s in range(1, S - 1):
        t0 = first_chunk(s, S, nC) * C
        t1 = min(T, first_chunk(s + 1, S, nC) * C)
        if t1 - t0 < W - 1:
            return s
    return -1


def default_spans(T, chunk, W=4):
    """SpanPlan::DefaultSpans: about T / 16384, at least 8, at most one per chunk."""
    C = min(max(chunk, 1), max(T, 1))
    nC = -(-T // C)
    S = min(nC, max(MIN_DEFAULT_SPANS, T // TOKENS_PER_SPAN))
    while S > 1 and short_span(T, C, S, W) >= 0:
        S -= 1
    return max(S, 1)


class SpanPlan:
    """Tasks and dependencies of one step, exactly as SpanPlan::Build (engine/span_plan.cc).
    tasks[id] = (phase, layer, span); deps[id] sorted, all lower ids; ranges[s] = (t0, len,
    halo) with halo = min(W - 1, t0)."""

    def __init__(self, T, chunk, spans, K, W=4):
        if T < 1 or chunk < 1 or K < 1 or W < 1 or spans < 0:
            raise FleetError(f"span plan: T={T} chunk={chunk} spans={spans} K={K} out of range")
        self.T, self.C, self.K, self.W = T, min(chunk, T), K, W
        self.nC = -(-T // self.C)
        S = spans or default_spans(T, chunk, W)
        if S > self.nC:
            raise FleetError(f"--spans {S}: T={T} in chunks of {self.C} gives {self.nC} chunks")
        if short_span(T, self.C, S, W) >= 0:
            raise FleetError(f"--spans {S}: a span would hold fewer than W - 1 tokens")
        self.S = S
        self.ranges = []
        for s in range(S):
            c0, c1 = first_chunk(s, S, self.nC), first_chunk(s + 1, S, self.nC)
            t0 = c0 * self.C
            self.ranges.append((t0, min(T, c1 * self.C) - t0, min(W - 1, t0)))
        self._build()

    def _build(self):
        S, K = self.S, self.K
        self.tasks, self.index = [], {}
        def add(phase, k, s):
            self.index[(phase, k, s)] = len(self.tasks)
            self.tasks.append((phase, k, s))
        for k in range(K):
            for s in range(S - 1):
                add(FWD_SUMMARY, k, s)
            for s in range(S):
                add(FWD, k, s)
        for k in range(K - 1, -1, -1):
            for s in range(S - 1, 0, -1):
                add(BWD_SUMMARY, k, s)
            for s in range(S - 1, -1, -1):
                add(BWD, k, s)
        self.deps = [self._deps_of(*t) for t in self.tasks]

    def id(self, phase, k, s):
        return self.index.get((phase, k, s), -1)

    def _deps_of(self, phase, k, s):
        d = set()
        def dep(ph, kk, ss):
            j = self.id(ph, kk, ss)
            if j >= 0:
                d.add(j)
        if phase in (FWD_SUMMARY, FWD):
            dep(FWD, k - 1, s)      # u^k of the span
            dep(FWD, k - 1, s - 1)  # and its conv halo rows from the span before
            if phase == FWD:        # h0(k, s): every summary up to its own
                for s2 in range(s + 1):
                    dep(FWD_SUMMARY, k, s2)
        else:
            if k + 1 == self.K:     # dL/du^K from the head
                dep(FWD, k, s)
            else:                   # dL/du^{k+1}, and its halo part from the span after
                dep(BWD, k + 1, s)
                dep(BWD, k + 1, s + 1)
            if phase == BWD:        # mu(k, s): every summary from the last down to its own
                for s2 in range(self.S - 1, s - 1, -1):
                    dep(BWD_SUMMARY, k, s2)
        return sorted(d)

    def first_task_of_span(self, s):
        """The span's first task, which fetches its tokens: fwd_summary(0, s), or fwd(0, S-1)."""
        return self.id(FWD_SUMMARY, 0, s) if s + 1 < self.S else self.id(FWD, 0, s)


# --------------------------------------------------- bytes on the wire (span_tensors.h)

def span_start_bytes(plan, s):
    """"tokens" I64 of ids [t0 - H, min(T, t0 + len + 1)) with the span's first task."""
    t0, n, h = plan.ranges[s]
    return 8 * (min(plan.T, t0 + n + 1) - (t0 - h))


def input_bytes(shape, plan, task):
    """The tensors a task fetches (no parameters, no span start): halo_u (H, D), h0 (Di, N),
    du_halo (H(s+1), D), mu (Di, N), as engine/span_tensors.cc InputSlots."""
    phase, k, s = task
    D, DiN, K, S = shape.D, shape.Di * shape.N, plan.K, plan.S
    b = 0
    if phase in (FWD_SUMMARY, FWD):
        if k > 0 and s > 0:
            b += plan.ranges[s][2] * D
        if phase == FWD and s > 0:
            b += DiN
    else:
        if k + 1 < K and s + 1 < S:
            b += plan.ranges[s + 1][2] * D
        if phase == BWD and s + 1 < S:
            b += DiN
    return F32 * b


def partial_bytes(shape, task):
    """{group: bytes} of the parameter partials in a task's result: layer k's gradient with
    bwd(k, s), the (V, D) embedding partial with bwd(0, s), the head's (V, D) + norm_f (D)
    with fwd(K-1, s). Group EMBED gathers the embedding, head and norm_f partials."""
    phase, k, s = task
    out = {}
    if phase == BWD:
        out[k] = F32 * shape.layer_params()
        if k == 0:
            out[EMBED] = F32 * shape.embed_params()
    elif phase == FWD and k + 1 == shape.K:
        out[EMBED] = F32 * (shape.embed_params() + shape.D)
    return out


def output_bytes(shape, plan, task):
    """Every byte of a task's result (OutputSlots + the scalars), partials included."""
    phase, k, s = task
    D, Di, N = shape.D, shape.Di, shape.N
    t0, n, h = plan.ranges[s]
    b = TIMING_BYTES + sum(partial_bytes(shape, task).values())
    if phase == FWD_SUMMARY:
        b += F32 * (Di + Di * N)                   # sigma (Di), h_end (Di, N)
    elif phase == FWD:
        if k + 1 < plan.K:
            b += F32 * min(shape.W - 1, n) * D     # halo_next
        else:
            b += HEAD_SCALAR_BYTES
    elif phase == BWD_SUMMARY:
        b += F32 * Di * N                          # m (Di, N)
    else:
        b += F32 * h * D                           # du_halo_prev (H, D)
    return b


# ------------------------------------------------------------------- flops and cost model

def layer_flops(shape):
    """FLOPs per token of one layer's tasks by phase (see the docstring), and of the head."""
    D, Di, N, R = shape.D, shape.Di, shape.N, shape.R
    g_in, g_x, g_dt, g_out = 4 * D * Di, 2 * Di * (R + 2 * N), 2 * R * Di, 2 * Di * D
    recompute, scan = g_in + g_x + g_dt, SCAN_FLOPS * Di * N
    return {
        FWD_SUMMARY: recompute + scan,
        FWD: recompute + scan + g_out,
        BWD_SUMMARY: recompute + g_out + scan,
        BWD: 3 * (recompute + g_out) + 3 * scan,
        "head": 3 * 2 * shape.V * D,  # logits, dE, and dL/du^K through the head
    }


def span_lengths(T, S):
    """Token counts of S spans as even as tokens go (a trace does not record its chunk)."""
    return [T * (s + 1) // S - T * s // S for s in range(S)]


class CostModel:
    """Seconds per token per FLOP for each phase, and for the LM head, fitted on a trace."""

    def __init__(self, coef, source):
        self.coef, self.source = coef, source

    @staticmethod
    def fit(records, shape, path):
        T, S = records[0]["T"], records[0]["spans"]
        lens = span_lengths(T, S)
        fl = layer_flops(shape)
        work, secs = defaultdict(float), defaultdict(float)
        head_tasks = []
        for r in records:
            t = r["compute_s"] + r["rebuild_s"]
            if r["phase"] == FWD and r["layer"] + 1 == shape.K:
                head_tasks.append((t, lens[r["span"]]))
                continue
            work[r["phase"]] += lens[r["span"]] * fl[r["phase"]]
            secs[r["phase"]] += t
        coef = {}
        for ph in PHASES:
            if work[ph] > 0:
                coef[ph] = secs[ph] / work[ph]
        if FWD not in coef:  # K = 1: every fwd ran the head; count them as fwd with the head
            coef[FWD] = coef["head"] = (sum(t for t, _ in head_tasks) /
                                        sum(n * (fl[FWD] + fl["head"]) for _, n in head_tasks))
        else:  # the head: what the top layer's fwd takes beyond a layer's forward
            rest = sum(t - coef[FWD] * n * fl[FWD] for t, n in head_tasks)
            coef["head"] = max(rest, 0.0) / sum(n * fl["head"] for _, n in head_tasks)
        missing = [ph for ph in PHASES if ph not in coef]
        if missing:
            raise FleetError(f"{path}: no {', '.join(missing)} tasks to fit the cost model on")
        return CostModel(coef, f"{path} ({shape}, T={T}, S={S})")

    def seconds(self, shape, phase, layer, tokens):
        """One task's seconds at the fitted (CPU) rate: tokens x its FLOPs per token x coef."""
        fl = layer_flops(shape)
        t = self.coef[phase] * tokens * fl[phase]
        if phase == FWD and layer + 1 == shape.K:
            t += self.coef["head"] * tokens * fl["head"]
        return t

    def describe(self):
        parts = [f"{ph} {1e-9 / self.coef[ph]:.1f}" for ph in PHASES + ("head",)]
        return "GFLOP/s fitted per phase: " + ", ".join(parts)


# -------------------------------------------------------------------------- the link model

class Net:
    """Latency (s) each way, bandwidth (bytes/s) per link direction, overhead (s) per RPC; an
    idle worker's PullTask waits long_poll (s) for a task, then it sleeps poll (s)."""

    def __init__(self, latency_us, bandwidth_gbps, overhead_us, poll_ms, long_poll_ms=100.0):
        if bandwidth_gbps <= 0:
            raise FleetError(f"--bandwidth-gbps {bandwidth_gbps}: must be positive")
        if min(latency_us, overhead_us, poll_ms, long_poll_ms) < 0:
            raise FleetError("--latency-us, --rpc-overhead-us, --poll-ms and --long-poll-ms "
                             "must be >= 0")
        self.lat, self.bw = latency_us * 1e-6, bandwidth_gbps * 1e9 / 8
        self.ovh, self.poll, self.long_poll = overhead_us * 1e-6, poll_ms * 1e-3, long_poll_ms * 1e-3

    def describe(self):
        return (f"latency {self.lat * 1e6:g} us, {self.bw * 8 / 1e9:g} Gb/s per link direction, "
                f"{self.ovh * 1e6:g} us per RPC, long poll {self.long_poll * 1e3:g} ms, poll "
                f"{self.poll * 1e3:g} ms")


class Link:
    """One direction of one link: a FIFO server (busy until `free`)."""

    def __init__(self):
        self.free = self.busy = 0.0
        self.bytes = 0


def transfer(now, nbytes, links, net):
    """Sends nbytes at `now` through `links` (held together, cut-through); returns when the
    last byte has arrived (latency included)."""
    if nbytes <= 0:
        return now + net.lat
    start = max([now] + [l.free for l in links])
    dur = nbytes / net.bw
    for l in links:
        l.free, l.busy, l.bytes = start + dur, l.busy + dur, l.bytes + nbytes
    return start + dur + net.lat


# ------------------------------------------------------------------------------ simulation

class SimTask:
    """A task as the simulator sees it. deps: ids; time: compute seconds; bytes_in/out: the
    inputs and results without parameters or partials; partials: {group: bytes}; param_key and
    param_bytes: what its worker fetches before its first task of that key (star: the whole
    model, key "all"; wavefront: the layer); layer: for the tree's parameter pieces; release:
    not ready before this time."""
    __slots__ = ("id", "span", "layer", "deps", "time", "bytes_in", "bytes_out", "partials",
                 "param_key", "param_bytes", "release")

    def __init__(self, id, span, layer, deps, time, bytes_in, bytes_out, partials,
                 param_key="all", param_bytes=0, release=0.0):
        self.id, self.span, self.layer, self.deps, self.time = id, span, layer, deps, time
        self.bytes_in, self.bytes_out, self.partials = bytes_in, bytes_out, partials
        self.param_key, self.param_bytes, self.release = param_key, param_bytes, release


class Result:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def binomial_children(i, A):
    """Children of tree node i among A nodes: i + 2^l for each level l below i's own."""
    top = (A - 1).bit_length() if i == 0 else (i & -i).bit_length() - 1
    return [i + (1 << l) for l in range(top - 1, -1, -1) if i + (1 << l) < A]


class Simulation:
    """Discrete-event list scheduling of one step. owner[span] = worker (or -1: any worker, the
    wavefront's shared queue). mode "star" or "tree" (tree: pieces = parameter bytes of the
    embedding then each layer, groups = {group: bytes of one sum})."""

    def __init__(self, tasks, owner, W, net, mode, pieces=(), groups=None):
        self.tasks, self.owner, self.W, self.net, self.mode = tasks, owner, W, net, mode
        self.pieces, self.groups = list(pieces), dict(groups or {})
        self.events, self.seq = [], 0
        self.coord_out, self.coord_in = Link(), Link()
        self.wk_in = [Link() for _ in range(W)]
        self.wk_out = [Link() for _ in range(W)]

    def push(self, t, kind, *args):
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, args))

    # -- task flow: lease -> fetch -> compute -> push -> result
    def run(self):
        net, W = self.net, self.W
        n = len(self.tasks)
        # An unanswered PullTask round: its long poll, NoTask, the sleep, the next request.
        self.cycle = net.long_poll + net.poll + 2 * net.lat + net.ovh
        self.state = ["idle"] * W
        # The step starts halfway through each worker's long poll (or poll interval).
        self.idle_since = [-(net.long_poll or self.cycle) / 2] * W
        self.ready_own = [[] for _ in range(W)]
        self.ready_any = []
        self.waiting = [None] * W                        # fetched, waiting for a piece
        self.cached = [set() for _ in range(W)]
        self.left = [len(t.deps) for t in self.tasks]
        self.succ = [[] for _ in range(n)]
        for t in self.tasks:
            for d in t.deps:
                self.succ[d].append(t.id)
        self.start, self.end = [0.0] * n, [0.0] * n
        self.compute_s, self.done, self.last = 0.0, 0, 0.0
        self._setup_tree()
        for t in self.tasks:
            if not t.deps:
                self.push(t.release, "ready", t.id)
        while self.events:
            t, _, kind, args = heapq.heappop(self.events)
            getattr(self, "on_" + kind)(t, *args)
        if self.done != n:
            raise FleetError(f"the step did not finish: {n - self.done} tasks never became "
                             "ready (a dependency cycle or a missing task in the trace?)")
        step = max(self.last, max(self.end, default=0.0))
        return Result(step_s=step, compute_s=self.compute_s, start=self.start, end=self.end,
                      coord_busy=max(self.coord_out.busy, self.coord_in.busy) / step if step else 0,
                      coord_bytes=self.coord_out.bytes + self.coord_in.bytes,
                      worker_max_bytes=max(a.bytes + b.bytes
                                           for a, b in zip(self.wk_in, self.wk_out)))

    def worker_of(self, task):
        return self.owner[task.span] if task.span >= 0 else -1

    def on_ready(self, now, tid):
        task = self.tasks[tid]
        w = self.worker_of(task)
        if w >= 0:
            heapq.heappush(self.ready_own[w], tid)
            self.wake(w, now)
        else:
            heapq.heappush(self.ready_any, tid)
            for v in range(self.W):
                self.wake(v, now)

    def wake(self, w, now):
        """A task became ready for idle worker w: its PullTasks listen during
        [idle_since + j cycle, + long_poll]; inside such a window it leases now, else at the
        start of the next one."""
        if self.state[w] != "idle":
            return
        t = now
        if self.cycle > 0:
            since = now - self.idle_since[w]
            j = math.floor(since / self.cycle + 1e-12)
            if since - j * self.cycle > self.net.long_poll + 1e-12:
                t = self.idle_since[w] + (j + 1) * self.cycle
        self.state[w] = "polling"
        self.push(t, "poll", w)

    def on_poll(self, now, w):
        """PullTask handled at the coordinator: the lowest ready id of w's own, else any."""
        if self.ready_own[w]:
            tid = heapq.heappop(self.ready_own[w])
        elif self.ready_any:
            tid = heapq.heappop(self.ready_any)
        else:
            self.state[w], self.idle_since[w] = "idle", now
            return
        self.state[w] = "busy"
        self.start[tid] = now
        net = self.net
        self.push(now + 2 * net.lat + net.ovh, "fetch", w, tid)  # reply, FetchInputs request

    def on_fetch(self, now, w, tid):
        task = self.tasks[tid]
        b = task.bytes_in
        if self.mode != "tree" and task.param_bytes and task.param_key not in self.cached[w]:
            self.cached[w].add(task.param_key)
            b += task.param_bytes
        self.push(transfer(now, b, [self.coord_out, self.wk_in[w]], self.net), "inputs", w, tid)

    def on_inputs(self, now, w, tid):
        if self.mode == "tree" and self.have[w] < self.tasks[tid].layer + 2:
            self.waiting[w] = tid  # its layer's parameters are still coming down the tree
            return
        self.push(now + self.tasks[tid].time, "computed", w, tid)

    def on_computed(self, now, w, tid):
        task = self.tasks[tid]
        self.compute_s += task.time
        b = task.bytes_out
        if self.mode == "tree":
            for g in task.partials:
                self.partial_done(now, w, g)
        else:
            b += sum(task.partials.values())
        arrive = transfer(now, b, [self.wk_out[w], self.coord_in], self.net)
        self.push(arrive + self.net.ovh, "result", w, tid)

    def on_result(self, now, w, tid):
        self.end[tid], self.done = now, self.done + 1
        for s in self.succ[tid]:
            self.left[s] -= 1
            if self.left[s] == 0:
                self.push(max(now, self.tasks[s].release), "ready", s)
        self.state[w] = "polling"  # PushResult's reply, then the next PullTask
        self.push(now + 2 * self.net.lat + self.net.ovh, "poll", w)

    # -- the tree: parameter pieces down, partial sums up
    def _setup_tree(self):
        self.have = [0] * self.W  # parameter pieces arrived (tree)
        if self.mode != "tree":
            return
        active = sorted({self.owner[t.span] for t in self.tasks})
        self.node_of = {w: i for i, w in enumerate(active)}
        self.act, A = active, len(active)
        self.levels = (A - 1).bit_length()
        for j, b in enumerate(self.pieces):  # coordinator -> node 0, in order
            arrive = transfer(0.0, b, [self.coord_out, self.wk_in[active[0]]], self.net)
            self.push(arrive + self.net.ovh, "piece", 0, j)
        # per group and node: partials still to come, levels done, sums arrived per level
        self.pending = defaultdict(int)
        for t in self.tasks:
            for g in t.partials:
                self.pending[(g, self.node_of[self.owner[t.span]])] += 1
        self.level = defaultdict(int)
        self.arrived = set()

    def on_piece(self, now, i, j):
        w = self.act[i]
        self.have[w] = j + 1
        for c in binomial_children(i, len(self.act)):
            arrive = transfer(now, self.pieces[j], [self.wk_out[w], self.wk_in[self.act[c]]],
                              self.net)
            self.push(arrive + self.net.ovh, "piece", c, j)
        tid = self.waiting[w]
        if tid is not None and self.have[w] >= self.tasks[tid].layer + 2:
            self.waiting[w] = None
            self.push(now + self.tasks[tid].time, "computed", w, tid)

    def partial_done(self, now, w, g):
        i = self.node_of[w]
        self.pending[(g, i)] -= 1
        if self.pending[(g, i)] == 0:
            self.advance(now, g, i)

    def advance(self, now, g, i):
        """Node i's sum of group g goes up as far as it can: it waits at each level for its
        right partner's sum, then (a right node) sends to its left partner, or (the root)
        to the coordinator."""
        if self.pending[(g, i)] > 0:
            return
        A, b = len(self.act), self.groups[g]
        while self.level[(g, i)] < self.levels:
            l = self.level[(g, i)]
            step = 1 << l
            if i % (2 * step) == 0:
                if i + step < A and (g, i, l) not in self.arrived:
                    return
                self.level[(g, i)] = l + 1
                continue
            arrive = transfer(now, b, [self.wk_out[self.act[i]], self.wk_in[self.act[i - step]]],
                              self.net)
            self.level[(g, i)] = self.levels + 1
            self.push(arrive + self.net.ovh, "sum", i - step, g, l)
            return
        if i == 0 and self.level[(g, i)] == self.levels:
            self.level[(g, i)] = self.levels + 1
            arrive = transfer(now, b, [self.wk_out[self.act[0]], self.coord_in], self.net)
            self.push(arrive + self.net.ovh, "reduced", g)

    def on_sum(self, now, i, g, l):
        self.arrived.add((g, i, l))
        self.advance(now, g, i)

    def on_reduced(self, now, g):
        self.last = max(self.last, now)


def block_owners(S, W, how="block"):
    """Span s -> worker: s W // S (contiguous blocks) or s mod W (round-robin)."""
    return [s * W // S if how == "block" else s % W for s in range(S)]


def critical_path(tasks):
    """Task seconds and the longest dependent chain by task times (ids are topological)."""
    finish = [0.0] * len(tasks)
    for t in tasks:
        finish[t.id] = max((finish[d] for d in t.deps), default=0.0) + t.time
    return sum(t.time for t in tasks), max(finish, default=0.0)


# ---------------------------------------------------------------------- the three workloads

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


def tree_pieces(shape, param_bytes=None):
    """Parameter pieces down the tree: embedding + norm_f, then each layer. Bytes per piece;
    a --param-bytes other than the shape's scales them all."""
    p = [F32 * (shape.embed_params() + shape.D)] + [F32 * shape.layer_params()] * shape.K
    if param_bytes is not None and param_bytes != sum(p):
        f = param_bytes / sum(p)
        p = [x * f for x in p]
    return p


def tree_groups(shape):
    g = {k: F32 * shape.layer_params() for k in range(shape.K)}
    g[EMBED] = F32 * (shape.embed_params() + shape.D)
    return g


def wavefront_tasks(shape, plan, cost, speed, partials):
    """The retired schedule: the coordinator's serial forward + head (returned as the release
    time of every task), then (k, c) backward tasks, top layer first, last chunk first; each
    needs (k+1, c) and (k, c+1)."""
    K, nC, D, DiN = shape.K, plan.nC, shape.D, shape.Di * shape.N
    chunks = [(c * plan.C, min(plan.C, plan.T - c * plan.C), min(shape.W - 1, c * plan.C))
              for c in range(nC)]  # (t0, len, halo)
    fl = layer_flops(shape)
    forward = sum(cost.coef[FWD] * n * fl[FWD] for _, n, _ in chunks) * K
    forward = (forward + cost.coef["head"] * plan.T * fl["head"]) / speed
    layer_bytes = F32 * shape.layer_params()
    def tid(k, c):
        return (K - 1 - k) * nC + (nC - 1 - c)
    tasks = []
    for k in range(K - 1, -1, -1):
        for c in range(nC - 1, -1, -1):
            _, n, h = chunks[c]
            deps = sorted(tid(kk, cc) for kk, cc in ((k + 1, c), (k, c + 1))
                          if kk < K and cc < nC)
            b_in = F32 * ((h + n) * D + n * D + DiN + (DiN if c + 1 < nC else 0))  # u, g, h0, mu
            b_out = F32 * (n * D + h * D + DiN)                                 # du, du_halo, mu_out
            part = {k: layer_bytes} if partials == "task" else {}
            t = cost.coef[BWD] * n * fl[BWD] / speed
            tasks.append(SimTask(tid(k, c), -1, k, deps, t, b_in, b_out, part, k, layer_bytes,
                                 forward))
    return tasks, forward


# -------------------------------------------------------------------------------- traces

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


def infer_shape(records):
    """D, K, N, V, E from a worker trace's result sizes (conv W = 4, R = ceil(D/16)): m is
    (Di, N); sigma + h_end is (Di) + (Di, N); halo_next (3, D); the head's (V, D) + (D)."""
    K = trace_layers(records)
    size = defaultdict(list)
    for r in records:
        size[(r["phase"], r["layer"] + 1 == K, r["span"] == 0)].append(r["bytes_out"])
    def one(key):
        return max(size[key]) if size[key] else None
    try:
        DiN = (one((BWD_SUMMARY, True, False)) - TIMING_BYTES) // F32
        Di = (one((FWD_SUMMARY, K == 1, True)) - TIMING_BYTES) // F32 - DiN
        if K > 1:
            D = (one((FWD, False, True)) - TIMING_BYTES) // (3 * F32)
        else:  # du_halo_prev (3, D) of a later span over span 0's none
            D = (one((BWD, True, False)) - one((BWD, True, True))) // (3 * F32)
        V = (one((FWD, True, True)) - TIMING_BYTES - HEAD_SCALAR_BYTES) // (F32 * D) - 1
        shape = Shape(D, K, DiN // Di, V, Di // D)
    except (TypeError, ZeroDivisionError, FleetError):
        shape = None
    # check: bwd(K-1, 0) (or bwd(0, 0)) returns exactly the layer's partial (+ embedding)
    if shape is not None and shape.Di == Di and shape.Di * shape.N == DiN:
        want = TIMING_BYTES + F32 * shape.layer_params() + (F32 * shape.embed_params()
                                                            if K == 1 else 0)
        if one((BWD, True, True)) == want:
            return shape
    raise FleetError("cannot infer the model shape from the trace's byte counts; pass "
                     "--model D,K,N,V,E")


def trace_shape(records, model_flag):
    K = trace_layers(records)
    if model_flag:
        shape = parse_shape(model_flag)
        if shape.K != K:
            raise FleetError(f"--model has K={shape.K} layers, the trace {K}")
        return shape
    if not has_bytes(records):
        raise FleetError("this trace has no byte counts (an in-process run): pass --model "
                         "D,K,N,V,E and --chunk C to price its transfers")
    return infer_shape(records)


def recorded_param_fetches(records, P):
    """Ids of the tasks whose recorded bytes_in carried the parameters: each worker's first
    task (by lease time) when it fetched at least P bytes."""
    first = {}
    for r in sorted(records, key=lambda r: (r["start_s"], r["id"])):
        first.setdefault(r["worker"], r)
    return {r["id"] for r in first.values() if r["bytes_in"] >= P}


def trace_tasks(records, shape, speed, param_bytes, chunk):
    """SimTasks of a recorded step: times from the trace, deps from the trace, bytes from the
    trace less the parameters and partials (or, with no byte counts, from the shapes)."""
    T, S, K = records[0]["T"], records[0]["spans"], shape.K
    P = shape.param_bytes() if param_bytes is None else param_bytes
    if has_bytes(records):
        fetched = recorded_param_fetches(records, P)
        tasks = []
        for r in records:
            task = (r["phase"], r["layer"], r["span"])
            part = partial_bytes(shape, task)
            b_in = r["bytes_in"] - (P if r["id"] in fetched else 0)
            b_out = max(0, r["bytes_out"] - sum(part.values()))
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


def check_deps(records):
    """None when the trace's deps are SpanPlan's for its S and K, else the first difference."""
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


# ------------------------------------------------------------------------------- sweeping

def simulate(tasks, S, W, net, mode, shape=None, param_bytes=None, owner=None, how="block"):
    owner = owner or (block_owners(S, W, how) if S else [])
    if mode == "tree":
        return Simulation(tasks, owner, W, net, "tree", tree_pieces(shape, param_bytes),
                          tree_groups(shape)).run()
    return Simulation(tasks, owner, W, net, "star").run()


def sweep(workers, modes, run_one):
    """Rows per W: {mode: {step_s, speedup, efficiency, util, coord_busy, ...}}; speed-ups
    over each mode's own W = 1 (simulated even when not asked for)."""
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


# ------------------------------------------------------------------------------- commands

def cmd_replay(a):
    records, steps = load_trace(a.trace, a.step)
    shape = trace_shape(records, a.model)
    if a.speed <= 0:
        raise FleetError(f"--speed {a.speed}: must be positive")
    net = Net(a.latency_us, a.bandwidth_gbps, a.rpc_overhead_us, a.poll_ms, a.long_poll_ms)
    tasks = trace_tasks(records, shape, a.speed, a.param_bytes, a.chunk)
    S = records[0]["spans"]
    modes = modes_of(a.reduce)
    rows = sweep(a.workers, modes, lambda m, W: simulate(tasks, S, W, net, m, shape,
                                                          a.param_bytes, how=a.owners))
    total, cp = critical_path(tasks)
    diff = check_deps(records)
    print(f"replay {a.trace} step {records[0]['step']} ({len(steps)} steps in the file): "
          f"{len(tasks)} tasks, T={records[0]['T']}, S={S}, model {shape}, parameters "
          f"{(a.param_bytes or shape.param_bytes()) / 1e6:.1f} MB")
    print(f"task seconds {total:.4g} (speed {a.speed:g}), critical path {cp:.4g}, "
          f"parallelism {total / cp if cp else 0:.1f}; owners {a.owners}; {net.describe()}")
    if diff:
        print(f"note: the trace's dependencies are not SpanPlan's ({diff}); replayed as recorded")
    print()
    print(table(rows, modes))
    write_json(a.json, {"mode": "replay", "trace": a.trace, "step": records[0]["step"],
                        "model": repr(shape), "speed": a.speed, "owners": a.owners,
                        "net": net.describe(),
                        "task_seconds": total, "critical_path_s": cp, "rows": rows})


def parse_run(text):
    """FILE:W[:SECONDS]."""
    parts = text.rsplit(":", 2)
    try:
        if len(parts) == 3 and _is_int(parts[1]):
            return parts[0], int(parts[1]), float(parts[2])
        parts = text.rsplit(":", 1)
        if len(parts) == 2:
            return parts[0], int(parts[1]), None
    except ValueError:
        pass
    raise FleetError(f"--trace {text!r}: expected FILE:W or FILE:W:MEASURED_SECONDS")


def _is_int(s):
    try:
        int(s)
        return True
    except ValueError:
        return False


def lad_fit(rows):
    """Least absolute deviations of y = a x0 + b x1 over rows (x0, x1, y), by iteratively
    reweighted least squares; returns (a, b)."""
    w = [1.0] * len(rows)
    a = b = 0.0
    for _ in range(50):
        s00 = sum(wi * x0 * x0 for wi, (x0, x1, y) in zip(w, rows))
        s01 = sum(wi * x0 * x1 for wi, (x0, x1, y) in zip(w, rows))
        s11 = sum(wi * x1 * x1 for wi, (x0, x1, y) in zip(w, rows))
        t0 = sum(wi * x0 * y for wi, (x0, x1, y) in zip(w, rows))
        t1 = sum(wi * x1 * y for wi, (x0, x1, y) in zip(w, rows))
        det = s00 * s11 - s01 * s01
        if det <= 0:
            raise FleetError("calibrate: the traces do not vary enough in bytes to fit a "
                             "bandwidth")
        a, b = (t0 * s11 - t1 * s01) / det, (s00 * t1 - s01 * t0) / det
        w = [1.0 / max(abs(y - a * x0 - b * x1), 1e-6) for x0, x1, y in rows]
    return a, b


def fit_rows(records):
    """Observations for lad_fit, in (x = 2 lat + ovh, 1 / bandwidth): each task's time from
    lease to acceptance less its compute = 2 x + bytes / bw; the gap from a result to the
    same worker's next lease, when that task was ready by then, = x. Bytes in MB."""
    rows = []
    end = {r["id"]: r["end_s"] for r in records}
    by_worker = defaultdict(list)
    for r in records:
        busy = r["end_s"] - r["start_s"] - r["compute_s"] - r["rebuild_s"]
        rows.append((2.0, (r["bytes_in"] + r["bytes_out"]) / 1e6, busy))
        by_worker[r["worker"]].append(r)
    for rs in by_worker.values():
        rs.sort(key=lambda r: r["start_s"])
        for prev, nxt in zip(rs, rs[1:]):
            if max((end[d] for d in nxt["deps"]), default=0.0) <= prev["end_s"]:
                rows.append((1.0, 0.0, nxt["start_s"] - prev["end_s"]))
    return rows


def recorded_owners(records, S):
    """span -> worker index from the trace (the worker that ran most of its tasks), and W."""
    names = []
    count = defaultdict(lambda: defaultdict(int))
    for r in sorted(records, key=lambda r: r["start_s"]):
        if r["worker"] not in names:
            names.append(r["worker"])
        count[r["span"]][names.index(r["worker"])] += 1
    return [max(count[s], key=count[s].get) for s in range(S)], len(names)


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
    x, inv_bw = lad_fit(rows)
    if inv_bw <= 0:
        raise FleetError("calibrate: the fitted time per byte is not positive; give traces "
                         "with larger results")
    overhead_us = (x - 2 * a.latency_us * 1e-6) * 1e6
    bw_gbps = 8e6 / inv_bw / 1e9
    if overhead_us < 0:
        print(f"note: latency {a.latency_us} us already exceeds what the traces show; "
              "overhead set to 0")
        overhead_us = 0.0
    net = Net(a.latency_us, bw_gbps, overhead_us, a.poll_ms, a.long_poll_ms)
    print(f"fitted on {len(rows)} observations of {len(runs)} runs: --latency-us "
          f"{a.latency_us:g} (held) --rpc-overhead-us {overhead_us:.1f} --bandwidth-gbps "
          f"{bw_gbps:.3g} --poll-ms {a.poll_ms:g} --long-poll-ms {a.long_poll_ms:g}")
    print()
    print("| trace | W | tasks | task s | trace step s | measured s | predicted s | error |")
    print("|---|---|---|---|---|---|---|---|")
    out = []
    for path, W, measured, records, owner in runs:
        shape = trace_shape(records, a.model)
        tasks = trace_tasks(records, shape, 1.0, None, None)
        r = simulate(tasks, records[0]["spans"], W, net, "star", owner=owner)
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
    cost_shape = trace_shape(records, a.cost_model)
    cost = CostModel.fit(records, cost_shape, a.cost_trace)
    net = Net(a.latency_us, a.bandwidth_gbps, a.rpc_overhead_us, a.poll_ms, a.long_poll_ms)
    P = shape.param_bytes()
    tasks = plan_tasks(plan, shape, lambda i, ph, k, s: cost.seconds(
        shape, ph, k, plan.ranges[s][1]) / a.speed, P)
    modes = modes_of(a.reduce)
    rows = sweep(a.workers, modes, lambda m, W: simulate(tasks, plan.S, W, net, m, shape,
                                                          how=a.owners))
    wave, forward = wavefront_tasks(shape, plan, cost, a.speed, a.wavefront_partials)
    wrows = sweep(a.workers, ["wavefront"], lambda m, W: Simulation(
        wave, [], W, net, "star").run())
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
    print(f"owners {a.owners}; {net.describe()}")
    print()
    print(table(rows, modes + ["wavefront"]))
    write_json(a.json, {"mode": "synth", "model": repr(shape), "T": a.T, "chunk": plan.C,
                        "spans": plan.S, "speed": a.speed, "owners": a.owners,
                        "net": net.describe(),
                        "cost_coef": cost.coef, "task_seconds": total, "critical_path_s": cp,
                        "parallelism": total / cp, "wavefront_forward_s": forward,
                        "rows": rows})


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


def add_owners(p):
    p.add_argument("--owners", choices=("block", "round-robin"), default="block",
                   help="span s on worker s W // S (block, default) or s mod W (round-robin)")


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
    r.add_argument("--reduce", choices=("star", "tree", "both"), default="both")
    add_owners(r)
    g = r.add_mutually_exclusive_group()
    g.add_argument("--param-bytes", type=int, help="parameter bytes (default: from the shape)")
    g.add_argument("--model", help="D,K,N,V,E of the traced model (default: inferred from "
                   "the byte counts)")
    r.add_argument("--chunk", type=int, help="the traced chunk (only for in-process traces)")
    r.add_argument("--json", help="also write the numbers here")

    c = sub.add_parser("calibrate", help="fit the local link model to recorded runs",
                       description="Fit the per-RPC overhead and bandwidth of the local link to "
                       "traces, then compare predicted and measured steps.")
    c.add_argument("--trace", action="append", required=True, metavar="FILE:W[:SECONDS]",
                   help="a trace, its worker count and its measured step (repeatable)")
    c.add_argument("--step", type=int, help="the step of each trace (default: the lowest)")
    c.add_argument("--model", help="D,K,N,V,E (default: inferred from the byte counts)")
    add_net(c, 5.0, None, None)
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
    s.add_argument("--reduce", choices=("star", "tree", "both"), default="both")
    add_owners(s)
    s.add_argument("--wavefront-partials", choices=("task", "none"), default="task",
                   help="the wavefront's tasks return their layer's partial (task, as it "
                   "shipped) or not (none)")
    s.add_argument("--json", help="also write the numbers here")
    return top


def main(argv=None):
    a = parser().parse_args(argv)
    try:
        {"replay": cmd_replay, "calibrate": cmd_calibrate, "synth": cmd_synth}[a.cmd](a)
    except FleetError as e:
        print(f"fleet_sim.py {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
