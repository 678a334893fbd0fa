# The span plan of one step, engine/span_plan.cc mirrored exactly: the default span count, the
# spans' token ranges, the task ids in preference order (per layer fwd_summary(k, s) for s < S-1
# and fwd(k, s), then per layer from the top bwd_summary(k, s) for s > 0 and bwd(k, s)) and
# every task's dependencies.

from .errors import FleetError


PHASES = ("fwd_summary", "fwd", "bwd_summary", "bwd")
FWD_SUMMARY, FWD, BWD_SUMMARY, BWD = PHASES
TOKENS_PER_SPAN = 16384   # SpanPlan::DefaultSpans: one span per this many tokens
MIN_DEFAULT_SPANS = 8


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
