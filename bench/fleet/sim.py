# The simulator: discrete-event list scheduling of one step on W workers. A worker serves a task
# as worker/worker.cc does (PullTask with its long poll, FetchInputs, compute, PushResult), its
# own ready tasks lowest id first; the star reduction (everything through the coordinator) or
# the worker tree as built (engine/tree_reduce.h, worker/peer.cc): the parameter copy relayed
# down a chain of the workers, each group's partials summed up the span tree.

import heapq
import math
from collections import defaultdict

from .errors import FleetError
from .net import Link, transfer, transfer_span
from .wire import HEAD, LOOKUP, PARAM_PIECE_BYTES, TIED


class SimTask:
    """A task as the simulator sees it. deps: ids; time: compute seconds; bytes_in/out: the
    inputs and results without parameters or partials; partials: {group: bytes}; param_key and
    param_bytes: what its worker fetches before its first task of that key (star and tree: the
    whole model, key "all"; wavefront: the layer); layer: the task's layer; release: not ready
    before this time."""
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


def param_parent(i):
    """Where worker i > 0 of the tree fetches its parameter copy: worker i - 1, a chain
    (worker/peer.cc ParentOf; worker 0 fetches from the coordinator)."""
    return i - 1


def span_tree(S):
    """The reduction tree over span indices (engine/span_tree.h): [(lo, hi, parent)] with the
    root [0, S) first, node [lo, hi) split at lo + (hi - lo) // 2 down to single spans; and
    leaf[s], the node of span s."""
    nodes, leaf = [], [0] * S
    stack = [(0, S, -1)]
    while stack:
        lo, hi, parent = stack.pop()
        nodes.append((lo, hi, parent))
        me = len(nodes) - 1
        if hi - lo == 1:
            leaf[lo] = me
        else:
            mid = lo + (hi - lo) // 2
            stack += [(mid, hi, me), (lo, mid, me)]
    return nodes, leaf


class Simulation:
    """Discrete-event list scheduling of one step. owner[span] = worker (or -1: any worker, the
    wavefront's shared queue). mode "star" or "tree". groups (tree): {group: bytes of one node's
    value}; a group not in it takes the largest of its tasks' partials. priority: the order of a
    worker's ready tasks (priority_ranks)."""

    def __init__(self, tasks, owner, W, net, mode, groups=None, priority="id"):
        self.tasks, self.owner, self.W, self.net, self.mode = tasks, owner, W, net, mode
        self.priority, self.groups = priority, dict(groups or {})
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
        self.cached = [set() for _ in range(W)]
        self.left = [len(t.deps) for t in self.tasks]
        self.succ = [[] for _ in range(n)]
        for t in self.tasks:
            for d in t.deps:
                self.succ[d].append(t.id)
        self.start, self.end, self.began = [0.0] * n, [0.0] * n, [0.0] * n
        self.compute_s, self.done, self.last = 0.0, 0, 0.0
        # Where each worker's time goes (see account): its state since mark, and its past
        # states as (state, from, to).
        self.segs = [[] for _ in range(W)]
        self.mark, self.cat = [0.0] * W, ["idle"] * W
        self.rank = priority_ranks(self.tasks, self.priority)
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
        # The tied (V, D) pair's two roots go as one.
        tied = HEAD in self.reduced_groups and LOOKUP in self.reduced_groups
        if len(self.roots) != len(self.reduced_groups) - tied:
            raise FleetError("the step did not finish: a reduction group's root never reached "
                             "the coordinator")
        step = max(self.last, max(self.end, default=0.0))
        worker_bytes = [a.bytes + b.bytes for a, b in zip(self.wk_in, self.wk_out)]
        # began: each task's compute start; worker_out_bytes: what each worker's out link
        # carried (results, and in the tree its relayed copy and sums). Tree: tree_order (worker of each tree index),
        # params_at (when each worker's copy was in; None: no copy), sends (each node that
        # crossed workers: group, lo, hi, from, to, sent, arrived), roots (group, from,
        # arrived at the coordinator).
        return Result(step_s=step, compute_s=self.compute_s, start=self.start, end=self.end,
                      began=self.began, worker_time=self._close_accounts(step),
                      segments=self.segs,
                      coord_busy=max(self.coord_out.busy, self.coord_in.busy) / step if step else 0,
                      coord_bytes=self.coord_out.bytes + self.coord_in.bytes,
                      worker_bytes=worker_bytes, worker_max_bytes=max(worker_bytes),
                      worker_out_bytes=[b.bytes for b in self.wk_out],
                      tree_order=self.order, params_at=self.params_at, sends=self.sends,
                      roots=self.roots)

    # -- where each worker's time goes
    def account(self, w, now, cat):
        """Worker w is in state cat from now on: the time since its mark goes to the state it
        was in. States: compute; rpc (lease reply and FetchInputs request, the result's
        handling, PushResult's reply and the next PullTask: 2 lat + ovh, ovh, 2 lat + ovh);
        transfer (its inputs down, its result up: latency, queueing on the links, bytes /
        bandwidth); params (tree: its first task's FetchParams until the whole parameter copy
        is in, then the FetchInputs request, lat + ovh); poll (a task of its is ready, its
        PullTask is asleep between long polls); idle (no task of its is ready: waiting for
        dependencies). _close_accounts splits the idle time after a worker's last task into
        drained (others still compute) and tail (after the last task's result: the tree's last
        sums)."""
        if now > self.mark[w]:
            self.segs[w].append((self.cat[w], self.mark[w], now))
        self.mark[w], self.cat[w] = now, cat

    def _close_accounts(self, step):
        """{state: seconds} per worker over [0, step] (what follows the step's end, the last
        PullTasks, is left out)."""
        last_result = max(self.end, default=0.0)
        out = []
        for w in range(self.W):
            if self.mark[w] < step:  # idle to the end: drained, then the tail
                cut = min(max(self.mark[w], last_result), step)
                self.segs[w] += [("drained", self.mark[w], cut), ("tail", cut, step)]
                self.mark[w] = step
            acc = defaultdict(float)
            for cat, t0, t1 in self.segs[w]:
                acc[cat] += max(0.0, min(t1, step) - max(t0, 0.0))
            out.append(dict(acc))
        return out

    def worker_of(self, task):
        return self.owner[task.span] if task.span >= 0 else -1

    def on_ready(self, now, tid):
        task = self.tasks[tid]
        w = self.worker_of(task)
        if w >= 0:
            heapq.heappush(self.ready_own[w], (self.rank[tid], tid))
            self.wake(w, now)
        else:
            heapq.heappush(self.ready_any, (self.rank[tid], tid))
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
        self.account(w, now, "poll")
        self.push(t, "poll", w)

    def on_poll(self, now, w):
        """PullTask handled at the coordinator: w's own ready task first in priority (the lowest
        id, or the longest path to the step's end), else any."""
        if self.ready_own[w]:
            _, tid = heapq.heappop(self.ready_own[w])
        elif self.ready_any:
            _, tid = heapq.heappop(self.ready_any)
        else:
            if self.cat[w] == "poll":  # woken for a task another worker took: still idle
                self.cat[w] = "idle"
            self.account(w, now, "idle")
            self.state[w], self.idle_since[w] = "idle", now
            return
        self.account(w, now, "rpc")
        self.state[w] = "busy"
        self.start[tid] = now
        net = self.net
        self.push(now + 2 * net.lat + net.ovh, "fetch", w, tid)  # reply, FetchInputs request

    def on_fetch(self, now, w, tid):
        """The lease's reply and FetchInputs (or, in the tree, a worker's first FetchParams)
        request are in: its inputs (with the parameters, star) come down."""
        task = self.tasks[tid]
        b = task.bytes_in
        if task.param_bytes and task.param_key not in self.cached[w]:
            self.cached[w].add(task.param_key)
            if self.mode == "tree":  # FetchParams down the tree first, then FetchInputs
                self.account(w, now, "params")
                self.fetch_params(now, w, tid, task.param_bytes)
                return
            b += task.param_bytes
        self.fetch_inputs(now, w, tid, b)

    def fetch_inputs(self, now, w, tid, nbytes):
        self.account(w, now, "transfer")
        self.push(transfer(now, nbytes, [self.coord_out, self.wk_in[w]], self.net),
                  "inputs", w, tid)

    def on_inputs(self, now, w, tid):
        self.account(w, now, "compute")
        self.began[tid] = now
        self.push(now + self.tasks[tid].time, "computed", w, tid)

    def on_computed(self, now, w, tid):
        task = self.tasks[tid]
        self.compute_s += task.time
        b = task.bytes_out
        if self.mode != "tree":
            b += sum(task.partials.values())
        arrive = transfer(now, b, [self.wk_out[w], self.coord_in], self.net)
        if self.mode == "tree":
            # Its partials become leaves here. The worker pushes its result while its sender
            # thread pushes the sums (worker/peer.cc), both on w's link; the small result is
            # booked first so that it does not queue behind a (V, D) sum.
            for g in task.partials:
                self.leaf_done(now, g, task.span)
        self.account(w, now, "transfer")
        self.account(w, arrive, "rpc")  # w does nothing else until its result is handled
        self.push(arrive + self.net.ovh, "result", w, tid)

    def on_result(self, now, w, tid):
        self.end[tid], self.done = now, self.done + 1
        for s in self.succ[tid]:
            self.left[s] -= 1
            if self.left[s] == 0:
                self.push(max(now, self.tasks[s].release), "ready", s)
        self.state[w] = "polling"  # PushResult's reply, then the next PullTask
        self.push(now + 2 * self.net.lat + self.net.ovh, "poll", w)

    # -- the worker tree as built: the parameter copy down, the groups' sums up
    def _setup_tree(self):
        """Tree mode: the workers that own spans, numbered 0..A-1 in the order of their first
        span (order[i] = worker; worker 0 owns span 0); per reduction group the span tree's
        leaves still to come (a span's leaf of a group is complete when all its tasks carrying
        that group have finished: one task in a real plan)."""
        self.order, self.params_at, self.sends, self.roots = [], [None] * self.W, [], []
        self.reduced_groups = set()
        self.tied_done = {}  # HEAD, LOOKUP: when its root was complete at worker 0
        if self.mode != "tree":
            return
        first = {}
        for t in sorted(self.tasks, key=lambda t: t.span):
            first.setdefault(self.owner[t.span], t.span)
        self.order = sorted(first, key=first.get)
        self.index = {w: i for i, w in enumerate(self.order)}
        A = len(self.order)
        self.p_start, self.p_done = [None] * A, [None] * A  # each copy's stream
        self.p_request = [None] * A                         # (time, task, bytes) asked
        self.p_waiting = [[] for _ in range(A)]             # the next asked before it started
        S = len(self.owner)
        self.nodes, self.leaf = span_tree(S) if S else ([], [])
        self.leaves_left = defaultdict(int)
        gbytes = defaultdict(float)
        for t in self.tasks:
            for g, b in t.partials.items():
                self.leaves_left[(g, t.span)] += 1
                gbytes[g] = max(gbytes[g], b)
        self.reduced_groups = set(gbytes)
        for g in gbytes:
            self.groups.setdefault(g, gbytes[g])
        self.children_in = defaultdict(int)
        for g in sorted(self.reduced_groups, key=str):  # a span without a leaf: an empty one
            for s in range(S):
                if self.leaves_left[(g, s)] == 0:
                    self.node_done(0.0, g, self.leaf[s])

    def fetch_params(self, now, w, tid, nbytes):
        """Worker w's FetchParams request is in (at its predecessor in the chain, or worker 0's
        at the coordinator). Worker 0's copy streams from the coordinator; worker i's from
        worker i - 1 once that one's own stream has begun (each relays a piece as it
        arrives)."""
        i = self.index[w]
        self.p_request[i] = (now, tid, nbytes)
        if i == 0:
            start, arrive = transfer_span(now, nbytes, [self.coord_out, self.wk_in[w]], self.net)
            self.params_started(now, 0, start, arrive)
            return
        p = param_parent(i)
        if self.p_start[p] is None:
            self.p_waiting[p].append(i)
        else:
            self.push(max(now, self.p_start[p] + self.net.lat + self.net.ovh), "param_stream", i)

    def on_param_stream(self, now, i):
        """Worker i's copy streams from worker i - 1 (its parent), booked on the parent's out
        link and i's in link, so every link carries the copy once; being a relay, it ends no
        sooner than one piece (and a latency) after the parent's copy has arrived."""
        p, net = param_parent(i), self.net
        nbytes = self.p_request[i][2]
        start, arrive = transfer_span(now, nbytes, [self.wk_out[self.order[p]],
                                                    self.wk_in[self.order[i]]], net)
        piece = min(nbytes, PARAM_PIECE_BYTES)
        self.params_started(now, i, start, max(arrive, self.p_done[p] + piece / net.bw + net.lat))

    def params_started(self, now, i, start, arrive):
        self.p_start[i], self.p_done[i] = start, arrive
        self.push(arrive, "params_in", i)
        for c in self.p_waiting[i]:
            self.push(max(now, self.p_request[c][0], start + self.net.lat + self.net.ovh),
                      "param_stream", c)
        self.p_waiting[i] = []

    def on_params_in(self, now, i):
        """Worker i holds the whole copy: its FetchInputs request (lat + ovh), then its first
        task's inputs."""
        w, (_, tid, _) = self.order[i], self.p_request[i]
        self.params_at[w] = now
        self.push(now + self.net.lat + self.net.ovh, "inputs_request", w, tid)

    def on_inputs_request(self, now, w, tid):
        self.fetch_inputs(now, w, tid, self.tasks[tid].bytes_in)

    def leaf_done(self, now, g, s):
        """A task of span s carrying group g has finished (its partial is added where it ran,
        the owner of s)."""
        self.leaves_left[(g, s)] -= 1
        if self.leaves_left[(g, s)] == 0:
            self.node_done(now, g, self.leaf[s])

    def node_done(self, now, g, nid):
        """Node nid of group g is complete at the owner of its first span: it goes to the owner
        of its parent's first span (staying put when that is the same worker), the root to the
        coordinator. A send holds the sender's out link and the receiver's in link, in the
        order the sender's link can take them."""
        lo, hi, parent = self.nodes[nid]
        x, b, net = self.owner[lo], self.groups[g], self.net
        if parent < 0 and g in (HEAD, LOOKUP) and {HEAD, LOOKUP} <= self.reduced_groups:
            # A tied model: the head's and the lookups' roots, both at worker 0, go as one.
            self.tied_done[g] = now
            if len(self.tied_done) < 2:
                return
            g = TIED
        if parent < 0:
            arrive = transfer(now, b, [self.wk_out[x], self.coord_in], net)
            self.roots.append((g, x, arrive + net.ovh))
            self.push(arrive + net.ovh, "reduced", g)
            return
        y = self.owner[self.nodes[parent][0]]
        if y == x:
            self.child_in(now, g, parent)
            return
        arrive = transfer(now, b, [self.wk_out[x], self.wk_in[y]], net)
        self.sends.append((g, lo, hi, x, y, now, arrive + net.ovh))
        self.push(arrive + net.ovh, "sum", g, parent)

    def child_in(self, now, g, nid):
        self.children_in[(g, nid)] += 1
        if self.children_in[(g, nid)] == 2:  # left + right: the node is complete
            self.node_done(now, g, nid)

    def on_sum(self, now, g, nid):
        self.child_in(now, g, nid)

    def on_reduced(self, now, g):
        self.last = max(self.last, now)


def priority_ranks(tasks, priority="id"):
    """Each task's key in a worker's ready queue, lowest first: its id (SpanPlan's order, as the
    coordinator leases), or (critical-path) minus its bottom level, the longest chain of task
    times from its start to the step's end (ties by id)."""
    if priority == "id":
        return [t.id for t in tasks]
    succ = [[] for _ in tasks]
    for t in tasks:
        for d in t.deps:
            succ[d].append(t.id)
    level = [0.0] * len(tasks)
    for t in reversed(tasks):  # ids are topological: every dependency has a lower id
        level[t.id] = t.time + max((level[s] for s in succ[t.id]), default=0.0)
    return [-level[t.id] for t in tasks]


def block_owners(S, W, how="block"):
    """Span s -> worker: s W // S (contiguous blocks) or s mod W (round-robin)."""
    return [s * W // S if how == "block" else s % W for s in range(S)]


def critical_path(tasks):
    """Task seconds and the longest dependent chain by task times (ids are topological)."""
    finish = [0.0] * len(tasks)
    for t in tasks:
        finish[t.id] = max((finish[d] for d in t.deps), default=0.0) + t.time
    return sum(t.time for t in tasks), max(finish, default=0.0)
