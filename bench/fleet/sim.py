# The simulator: discrete-event list scheduling of one step on W workers. A worker serves a task
# as worker/worker.cc does (PullTask with its long poll, FetchInputs, compute, PushResult), its
# own ready tasks lowest id first; the star reduction (everything to the coordinator) or the
# tree (parameter pieces down and partial sums up a binomial tree of the workers).

import heapq
import math
from collections import defaultdict

from .errors import FleetError
from .net import Link, transfer


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
    embedding then each layer, groups = {group: bytes of one sum}). priority: the order of a
    worker's ready tasks (priority_ranks). tree_root: the tree's nodes are the workers in the
    order of their spans from the first span's owner (first; node 0, the root, owns span 0) or
    from the last span's (last)."""

    def __init__(self, tasks, owner, W, net, mode, pieces=(), groups=None, priority="id",
                 tree_root="first"):
        self.tasks, self.owner, self.W, self.net, self.mode = tasks, owner, W, net, mode
        self.priority, self.tree_root = priority, tree_root
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
        step = max(self.last, max(self.end, default=0.0))
        return Result(step_s=step, compute_s=self.compute_s, start=self.start, end=self.end,
                      worker_time=self._close_accounts(step), segments=self.segs,
                      coord_busy=max(self.coord_out.busy, self.coord_in.busy) / step if step else 0,
                      coord_bytes=self.coord_out.bytes + self.coord_in.bytes,
                      worker_max_bytes=max(a.bytes + b.bytes
                                           for a, b in zip(self.wk_in, self.wk_out)))

    # -- where each worker's time goes
    def account(self, w, now, cat):
        """Worker w is in state cat from now on: the time since its mark goes to the state it
        was in. States: compute; rpc (lease reply and FetchInputs request, the result's
        handling, PushResult's reply and the next PullTask: 2 lat + ovh, ovh, 2 lat + ovh);
        transfer (its inputs down, its result up: latency, queueing on the links, bytes /
        bandwidth); params (tree: its inputs are in, its layer's parameter piece is not);
        poll (a task of its is ready, its PullTask is asleep between long polls); idle (no
        task of its is ready: waiting for dependencies). _close_accounts splits the idle time
        after a worker's last task into drained (others still compute) and tail (after the
        last task's result: the tree's reduction)."""
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
        self.account(w, now, "transfer")
        task = self.tasks[tid]
        b = task.bytes_in
        if self.mode != "tree" and task.param_bytes and task.param_key not in self.cached[w]:
            self.cached[w].add(task.param_key)
            b += task.param_bytes
        self.push(transfer(now, b, [self.coord_out, self.wk_in[w]], self.net), "inputs", w, tid)

    def on_inputs(self, now, w, tid):
        if self.mode == "tree" and self.have[w] < self.tasks[tid].layer + 2:
            self.waiting[w] = tid  # its layer's parameters are still coming down the tree
            self.account(w, now, "params")
            return
        self.account(w, now, "compute")
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

    # -- the tree: parameter pieces down, partial sums up
    def _setup_tree(self):
        self.have = [0] * self.W  # parameter pieces arrived (tree)
        if self.mode != "tree":
            return
        active = sorted({self.owner[t.span] for t in self.tasks})
        if self.tree_root == "last":  # the last span's owner first, and so on down
            last = defaultdict(int)
            for t in self.tasks:
                last[self.owner[t.span]] = max(last[self.owner[t.span]], t.span)
            active.sort(key=lambda w: (-last[w], w))
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
            self.account(w, now, "compute")
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
