#!/usr/bin/python3
"""Tests of bench/fleet_sim.py (standard library unittest; exit 1 on a failure).

  /usr/bin/python3 tests/bench/test_fleet_sim.py [--adjsh PATH] [unittest flags]

What is checked:
  plan       the simulator's plan is the binary's: bench/fleet/plan.py reads `adjsh plan`
             (cli/plan_cmd.cc) and gives exactly what it prints (spans, chunks, tasks, deps,
             each span's first task), and a real trace's task ids, phases and "deps" (a
             recorded fixture, and a fresh trace); the default span counts the real runs
             used; a shape the plan refuses is an exit 2 naming the flag, and no binary a
             clear error (build it with scripts/build.sh);
  bytes      every task's recorded bytes_in / bytes_out equal the tensor shapes' sums
             (engine/span_tensors.h: inputs, span tokens with a span's first task, parameters
             with a worker's first), and the model shape inferred from those bytes;
  simulator  a chain-only DAG gives efficiency 1/W; W = 1 predicts the sum of task times plus
             transfers and per-RPC costs exactly; a wide DAG on W workers takes total / W; an
             idle worker leases at its next poll, or at once inside a long poll; the worker tree
             as built: its K + 3 groups (the tied pair's two roots sent as one), which nodes
             cross between workers (none with one worker; one per group with block owners at
             S = 8, W = 2, four round-robin; any owners as engine/tree_reduce.h sends), the
             parameter copy relayed piece by piece down the chain (worker i from i - 1, each a
             piece after its predecessor, every link carrying it once) before any task of a worker, a step never below the
             critical path, each link's bytes, and the star slower than the tree for large
             partials; the wavefront never runs more than K tasks at once;
  calibrate  the fit recovers the overhead and bandwidth a simulated run was made with;
  CLI        --help of every command, replay / synth / calibrate on the fixture, and clear
             errors (exit 2, no traceback) for bad input;
  live       a fresh star trace and worker-tree trace of the binary (3 workers): plan and bytes
             (the tree's results carry no partials, its fetches no parameters), and the sums,
             roots and relayed copies each worker logs are the simulated tree's.
The binary is --adjsh PATH, $ADJSH, or build/cli/adjsh (run, never built here); the checks that
need a plan (the plan's, the simulator's on real plans, synth) and the live checks are skipped
without one.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIM = os.path.join(ROOT, "bench", "fleet_sim.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import fleet as fs  # noqa: E402  (bench/fleet/, the package behind bench/fleet_sim.py)

ADJSH = os.environ.get("ADJSH", os.path.join(ROOT, "build", "cli", "adjsh"))
CORPUS = "/usr/share/common-licenses/GPL-3"

# A real trace: `adjsh grad --workers 2 --chunk 64 --spans 4 --trace` of a model D=16, K=3, N=4,
# V=256, E=2 on T=512 tokens. (id, phase, layer, span, deps, worker, bytes_in, bytes_out,
# start_s, end_s, compute_s). Recorded before results carried "device_traffic" (I64 (6)):
# fixture_records adds its 48 bytes to every bytes_out.
FIXTURE_SHAPE = (16, 3, 4, 256, 2)
FIXTURE_T, FIXTURE_CHUNK, FIXTURE_SPANS = 512, 64, 4
FIXTURE = [
    (0, "fwd_summary", 0, 0, [], "local-1", 44168, 656, 0.012462, 0.014118, 0.000185),
    (1, "fwd_summary", 0, 1, [], "local-1", 1056, 656, 0.026091, 0.026584, 0.000101),
    (2, "fwd_summary", 0, 2, [], "local-0", 44192, 656, 0.031552, 0.033047, 0.000161),
    (3, "fwd", 0, 0, [0], "local-1", 0, 208, 0.014308, 0.014844, 0.000194),
    (4, "fwd", 0, 1, [0, 1], "local-1", 512, 208, 0.026737, 0.027145, 0.000097),
    (5, "fwd", 0, 2, [0, 1, 2], "local-0", 512, 208, 0.033222, 0.033805, 0.000125),
    (6, "fwd", 0, 3, [0, 1, 2], "local-0", 1560, 208, 0.037334, 0.037872, 0.000102),
    (7, "fwd_summary", 1, 0, [3], "local-1", 0, 656, 0.015002, 0.015407, 0.000085),
    (8, "fwd_summary", 1, 1, [3, 4], "local-1", 192, 656, 0.027283, 0.027783, 0.000083),
    (9, "fwd_summary", 1, 2, [4, 5], "local-0", 192, 656, 0.033975, 0.034394, 0.000081),
    (10, "fwd", 1, 0, [3, 7], "local-1", 0, 208, 0.015554, 0.016074, 0.000095),
    (11, "fwd", 1, 1, [3, 4, 7, 8], "local-1", 704, 208, 0.027938, 0.028357, 0.000095),
    (12, "fwd", 1, 2, [4, 5, 7, 8, 9], "local-0", 704, 208, 0.034541, 0.035028, 0.000094),
    (13, "fwd", 1, 3, [5, 6, 7, 8, 9], "local-0", 704, 208, 0.038013, 0.038505, 0.000094),
    (14, "fwd_summary", 2, 0, [10], "local-1", 0, 656, 0.016217, 0.016594, 0.000081),
    (15, "fwd_summary", 2, 1, [10, 11], "local-1", 192, 656, 0.028495, 0.028925, 0.000086),
    (16, "fwd_summary", 2, 2, [11, 12], "local-0", 192, 656, 0.035171, 0.035566, 0.000079),
    (17, "fwd", 2, 0, [10, 14], "local-1", 0, 16480, 0.016733, 0.025723, 0.000252),
    (18, "fwd", 2, 1, [10, 11, 14, 15], "local-1", 704, 16480, 0.029075, 0.029673, 0.000202),
    (19, "fwd", 2, 2, [11, 12, 14, 15, 16], "local-0", 704, 16480, 0.035710, 0.036437, 0.000243),
    (20, "fwd", 2, 3, [12, 13, 14, 15, 16], "local-0", 704, 16480, 0.038681, 0.039311, 0.000239),
    (21, "bwd_summary", 2, 3, [20], "local-0", 0, 528, 0.039503, 0.039934, 0.000116),
    (22, "bwd_summary", 2, 2, [19], "local-0", 0, 528, 0.036597, 0.037145, 0.000088),
    (23, "bwd_summary", 2, 1, [18], "local-1", 0, 528, 0.029833, 0.030518, 0.000126),
    (24, "bwd", 2, 3, [20, 21], "local-0", 0, 9104, 0.040089, 0.040781, 0.000263),
    (25, "bwd", 2, 2, [19, 21, 22], "local-0", 512, 9104, 0.040959, 0.041654, 0.000236),
    (26, "bwd", 2, 1, [18, 21, 22, 23], "local-1", 512, 9104, 0.051443, 0.053891, 0.000350),
    (27, "bwd", 2, 0, [17, 21, 22, 23], "local-1", 512, 8912, 0.054085, 0.056368, 0.000251),
    (28, "bwd_summary", 1, 3, [24], "local-0", 0, 528, 0.041807, 0.042184, 0.000084),
    (29, "bwd_summary", 1, 2, [24, 25], "local-0", 192, 528, 0.042346, 0.042740, 0.000084),
    (30, "bwd_summary", 1, 1, [25, 26], "local-1", 192, 528, 0.056546, 0.056955, 0.000090),
    (31, "bwd", 1, 3, [24, 28], "local-0", 0, 9104, 0.042884, 0.043609, 0.000255),
    (32, "bwd", 1, 2, [24, 25, 28, 29], "local-0", 704, 9104, 0.043798, 0.044460, 0.000236),
    (33, "bwd", 1, 1, [25, 26, 28, 29, 30], "local-1", 704, 9104, 0.059954, 0.060757, 0.000255),
    (34, "bwd", 1, 0, [26, 27, 28, 29, 30], "local-1", 704, 8912, 0.060993, 0.061773, 0.000298),
    (35, "bwd_summary", 0, 3, [31], "local-0", 0, 528, 0.044699, 0.045094, 0.000084),
    (36, "bwd_summary", 0, 2, [31, 32], "local-0", 192, 528, 0.045268, 0.045674, 0.000088),
    (37, "bwd_summary", 0, 1, [32, 33], "local-1", 192, 528, 0.061932, 0.062359, 0.000086),
    (38, "bwd", 0, 3, [31, 35], "local-0", 0, 25488, 0.045855, 0.046562, 0.000235),
    (39, "bwd", 0, 2, [31, 32, 35, 36], "local-0", 704, 25488, 0.046715, 0.047459, 0.000244),
    (40, "bwd", 0, 1, [32, 33, 35, 36, 37], "local-1", 704, 25488, 0.062509, 0.068014, 0.000235),
    (41, "bwd", 0, 0, [33, 34, 35, 36, 37], "local-1", 704, 25296, 0.068323, 0.069046, 0.000245),
]


DEVICE_TRAFFIC_BYTES = 48


def fixture_records():
    return [{"step": 0, "id": i, "phase": ph, "layer": k, "span": s, "deps": d,
             "start_s": t0, "end_s": t1, "compute_s": c, "rebuild_s": 0.0, "worker": w,
             "bytes_in": bi, "bytes_out": bo + DEVICE_TRAFFIC_BYTES, "T": FIXTURE_T,
             "spans": FIXTURE_SPANS}
            for i, ph, k, s, d, w, bi, bo, t0, t1, c in FIXTURE]


def write_trace(dirname, records, name="trace.jsonl"):
    path = os.path.join(dirname, name)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


def cli(*args):
    return subprocess.run([sys.executable, SIM, *args], capture_output=True, text=True)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def assert_user_error(test, p, text):
    """A clear one-line error: exit 2, no traceback, the message names the problem."""
    test.assertEqual(p.returncode, 2, p.stderr)
    test.assertNotIn("Traceback", p.stderr)
    test.assertIn(text, p.stderr)


def need_adjsh():
    """Skips the test without a binary to make the plan."""
    if not os.access(ADJSH, os.X_OK):
        raise unittest.SkipTest(f"no adjsh binary at {ADJSH} (the plan comes from `adjsh plan`)")


def plan_of(*args, **kwargs):
    """The binary's plan, read as the simulator reads it (skips the test without a binary)."""
    need_adjsh()
    return fs.SpanPlan(*args, **kwargs)


def adjsh_plan(*args):
    """`adjsh plan ARGS` run directly: (exit code, stdout, stderr)."""
    need_adjsh()
    p = subprocess.run([ADJSH, "plan", *map(str, args)], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def zero_net():
    return fs.Net(0, 1e9, 0, 0)  # no latency, no overhead, no polling, ~free bytes


def task(i, span, deps, time, layer=0, b_in=0, b_out=0, partials=None, P=0):
    return fs.SimTask(i, span, layer, deps, time, b_in, b_out, partials or {}, "all", P)


def check_records_against_plan(test, records, shape, chunk, tree=False):
    """Ids, phases and deps are SpanPlan's; bytes are the shapes' (params: a worker's first;
    a worker-tree run's results carry no partials and its fetches no parameters)."""
    T, S = records[0]["T"], records[0]["spans"]
    plan = plan_of(T, chunk, S, shape.K, shape.W)
    test.assertEqual(len(plan.tasks), len(records))
    P = shape.param_bytes()
    first_of_worker = {}
    for r in sorted(records, key=lambda r: (r["start_s"], r["id"])):
        first_of_worker.setdefault(r["worker"], r["id"])
    firsts = {plan.first_task_of_span(s) for s in range(S)}
    for r in records:
        t = plan.tasks[r["id"]]
        test.assertEqual(t, (r["phase"], r["layer"], r["span"]), r["id"])
        test.assertEqual(plan.deps[r["id"]], r["deps"], f"deps of task {r['id']}")
        if not fs.has_bytes(records):
            continue
        want_in = (fs.input_bytes(shape, plan, t)
                   + (fs.span_start_bytes(plan, t[2]) if r["id"] in firsts else 0)
                   + (P if r["id"] in first_of_worker.values() and not tree else 0))
        want_out = fs.output_bytes(shape, plan, t) - (
            sum(fs.partial_bytes(shape, t).values()) if tree else 0)
        test.assertEqual(want_in, r["bytes_in"], f"bytes_in of task {r['id']} {t}")
        test.assertEqual(want_out, r["bytes_out"], f"bytes_out of task {r['id']} {t}")


class PlanTest(unittest.TestCase):
    def test_fixture_matches_plan_and_bytes(self):
        check_records_against_plan(self, fixture_records(), fs.Shape(*FIXTURE_SHAPE),
                                   FIXTURE_CHUNK)

    def test_check_deps_notices_a_difference(self):
        need_adjsh()
        recs = fixture_records()
        self.assertIsNone(fs.check_deps(recs))
        recs[30]["deps"] = recs[30]["deps"][:-1]
        self.assertIn("task 30", fs.check_deps(recs))

    def test_task_counts_and_order(self):
        for T, C, S, K in ((512, 64, 4, 3), (65536, 1024, 8, 4), (1 << 20, 4096, 64, 24)):
            p = plan_of(T, C, S, K)
            self.assertEqual(len(p.tasks), K * (4 * S - 2))
            self.assertTrue(all(d < i for i, ds in enumerate(p.deps) for d in ds))
            self.assertEqual(sum(n for _, n, _ in p.ranges), T)

    def test_default_spans(self):
        need_adjsh()
        self.assertEqual(fs.default_spans(65536, 1024), 8)      # the calibration runs' S
        self.assertEqual(fs.default_spans(1 << 20, 4096), 64)   # T / 16384
        self.assertEqual(fs.default_spans(2048, 1024), 2)       # at most one per chunk
        self.assertEqual(fs.default_spans(10, 1), 3)            # spans of >= W - 1 tokens
        self.assertEqual(plan_of(65536, 1024, 0, 2).S, 8)       # --spans 0: the default
        with self.assertRaisesRegex(fs.FleetError, "--spans 5"):
            fs.SpanPlan(1024, 256, 5, 2)                        # more spans than chunks

    def test_plan_is_what_the_binary_prints(self):
        for T, C, S, K, W in ((512, 64, 4, 3, 4), (1000, 64, 5, 2, 4), (300, 32, 0, 2, 4),
                              (250, 20, 4, 3, 7), (100, 256, 0, 1, 4)):
            rc, out, err = adjsh_plan("--context", T, "--chunk", C, "--spans", S, "--layers", K,
                                      "--conv-kernel", W)
            self.assertEqual(rc, 0, err)
            j = json.loads(out)
            p = fs.SpanPlan(T, C, S, K, W)
            self.assertEqual((p.T, p.C, p.nC, p.S, p.K, p.W),
                             (j["T"], j["chunk"], j["num_chunks"], j["num_spans"], j["layers"],
                              j["conv_kernel"]))
            self.assertEqual(p.ranges, [(r["t0"], r["len"], r["halo"]) for r in j["spans"]])
            self.assertEqual(p.chunks, [(c["t0"], c["len"], c["halo"]) for c in j["chunks"]])
            self.assertEqual(p.tasks, [(t["phase"], t["layer"], t["span"]) for t in j["tasks"]])
            self.assertEqual(p.deps, [t["deps"] for t in j["tasks"]])
            self.assertEqual([p.first_task_of_span(s) for s in range(p.S)],
                             [r["first_task"] for r in j["spans"]])
            # what the simulator relies on: the spans and the chunks cover [0, T) in order, a
            # span is a run of whole chunks, its tokens come with its first task (layer 0's)
            self.assertEqual([t0 for t0, _, _ in p.ranges],
                             [sum(n for _, n, _ in p.ranges[:s]) for s in range(p.S)])
            self.assertEqual(sum(n for _, n, _ in p.ranges), T)
            self.assertEqual(sum(n for _, n, _ in p.chunks), T)
            self.assertEqual([h for _, _, h in p.ranges], [min(W - 1, t0) for t0, _, _ in p.ranges])
            for s in range(p.S):
                first = (fs.FWD_SUMMARY, 0, s) if s + 1 < p.S else (fs.FWD, 0, s)
                self.assertEqual(p.first_task_of_span(s), p.id(*first), (T, C, S, s))

    def test_forward_only_plan(self):
        full, fwd = plan_of(200, 25, 3, 3), plan_of(200, 25, 3, 3, forward_only=True)
        self.assertTrue(fwd.forward_only)
        self.assertEqual(len(fwd.tasks), 3 * (2 * 3 - 1))
        self.assertEqual(fwd.tasks, full.tasks[:len(fwd.tasks)])
        self.assertEqual(fwd.deps, full.deps[:len(fwd.deps)])

    def test_a_malformed_shape_is_refused(self):
        for args, flag in ((("--context", 1024, "--chunk", 256, "--spans", 5, "--layers", 2),
                            "--spans 5"),
                           (("--context", 10, "--chunk", 1, "--spans", 4, "--layers", 1),
                            "W - 1"),
                           (("--context", 0, "--layers", 2), "--context"),
                           (("--context", 100, "--chunk", -1, "--layers", 2), "--chunk"),
                           (("--context", 100, "--layers", 0), "--layers")):
            rc, out, err = adjsh_plan(*args)
            self.assertEqual(rc, 2, (args, err))
            self.assertEqual(out, "")
            self.assertIn(flag, err, args)
        with self.assertRaisesRegex(fs.FleetError, "W - 1"):
            fs.SpanPlan(10, 1, 4, 1)
        with self.assertRaisesRegex(fs.FleetError, "--context"):
            fs.SpanPlan(-3, 4, 0, 1)

    def test_no_binary_is_a_clear_error(self):
        missing = os.path.join(ROOT, "no", "such", "adjsh")
        with self.assertRaisesRegex(fs.AdjshMissing, "scripts/build.sh"):
            fs.SpanPlan(512, 64, 4, 3, adjsh=missing)
        with tempfile.TemporaryDirectory() as d:
            p = cli("synth", "--model", "64,2,8,512,2", "--T", "16384", "--chunk", "512",
                    "--cost-trace", write_trace(d, fixture_records()), "--speed", "1",
                    "--adjsh", missing)
            assert_user_error(self, p, "scripts/build.sh")
            # a replay needs no plan: it runs, and says the dependencies went unchecked
            p = cli("replay", "--trace", os.path.join(d, "trace.jsonl"), "--workers", "1,2",
                    "--adjsh", missing)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("not checked", p.stdout)

    def test_param_count_of_the_130m_shape(self):
        self.assertEqual(fs.Shape(768, 24, 16, 50280, 2).params(), 129135360)

    def test_shape_inferred_from_bytes(self):
        self.assertEqual(repr(fs.infer_shape(fixture_records())), "D=16,K=3,N=4,V=256,E=2")
        recs = fixture_records()
        for r in recs:
            r["bytes_out"] += 4 if r["phase"] == "bwd" else 0
        with self.assertRaises(fs.FleetError):
            fs.infer_shape(recs)


class SimulationTest(unittest.TestCase):
    def sweep(self, tasks, S, workers, net, mode="star"):
        return {W: fs.simulate(tasks, S, W, net, mode, fs.Shape(*FIXTURE_SHAPE)).step_s
                for W in workers}

    def test_chain_gives_efficiency_one_over_W(self):
        S = 16
        tasks = [task(i, i % S, [i - 1] if i else [], 0.01 + 0.001 * (i % 3)) for i in range(64)]
        steps = self.sweep(tasks, S, (1, 2, 4, 8, 16), zero_net())
        total = sum(t.time for t in tasks)
        for W, step in steps.items():
            self.assertAlmostEqual(step, total, places=9)
            self.assertAlmostEqual(steps[1] / step / W, 1 / W, places=6)
        # with link costs the chain still gains nothing from more workers
        net = fs.Net(10, 10, 50, 20)
        steps = self.sweep(tasks, S, (1, 4, 16), net)
        for W in (4, 16):
            self.assertLess(steps[1] / steps[W] / W, 1.25 / W)

    def test_one_worker_is_the_sum_of_tasks_and_transfers(self):
        rng = random.Random(7)
        n, S, P = 80, 8, 3_000_000
        tasks = []
        for i in range(n):
            deps = sorted(rng.sample(range(i), min(i, rng.randint(0, 3))))
            tasks.append(task(i, rng.randrange(S), deps, rng.uniform(0.001, 0.02), 0,
                              rng.randint(0, 50000), rng.randint(0, 50000),
                              {0: rng.randint(0, 100000)} if i % 5 == 0 else {}, P))
        lat, ovh, gbps = 20e-6, 100e-6, 8.0
        bw = gbps * 1e9 / 8
        moved = P + sum(t.bytes_in + t.bytes_out + sum(t.partials.values()) for t in tasks)
        # per task: lease reply + fetch request (2 lat + ovh), inputs (lat), result (lat + ovh),
        # then its reply and the next PullTask (2 lat + ovh); the first lease at the step's
        # start (a long poll was waiting), or half a poll round in without one
        for long_poll, first in ((100, 0.0), (0, (20e-3 + 2 * lat + ovh) / 2)):
            net = fs.Net(lat * 1e6, gbps, ovh * 1e6, 20, long_poll)
            want = (first + sum(t.time for t in tasks) + moved / bw
                    + n * (4 * lat + 2 * ovh) + (n - 1) * (2 * lat + ovh))
            got = fs.Simulation(tasks, [0] * S, 1, net, "star").run().step_s
            self.assertAlmostEqual(got, want, places=9)

    def test_wide_dag_takes_total_over_W(self):
        S = 64
        tasks = [task(i, i // 8, [], 0.01) for i in range(8 * S)]
        total = sum(t.time for t in tasks)
        steps = self.sweep(tasks, S, (1, 2, 4, 8, 16, 32, 64), zero_net())
        for W, step in steps.items():
            self.assertAlmostEqual(step, total / W, places=9)
        net = fs.Net(10, 100, 50, 20)
        for W, step in self.sweep(tasks, S, (1, 8, 64), net).items():
            self.assertGreater(total / W / step, 0.6, W)  # 8 tasks per worker, 1 poll

    def test_idle_worker_leases_at_its_next_poll(self):
        # Without a long poll: A on worker 0 ends at 0.06; B (worker 1) was ready then, and
        # worker 1 polls every 20 ms from 0.01 (mid-phase at the start): it leases B at 0.07.
        net = fs.Net(0, 1e9, 0, 20, long_poll_ms=0)
        tasks = [task(0, 0, [], 0.05), task(1, 1, [0], 0.01)]
        r = fs.Simulation(tasks, [0, 1], 2, net, "star").run()
        self.assertAlmostEqual(r.start[0], 0.01)
        self.assertAlmostEqual(r.end[0], 0.06)
        self.assertAlmostEqual(r.start[1], 0.07)
        self.assertAlmostEqual(r.step_s, 0.08)

    def test_long_poll(self):
        # Worker 1 listens during [-0.05, 0.05], [0.07, 0.17], ... (100 ms long polls, then
        # 20 ms asleep): B ready at 0.06 waits for 0.07; ready at 0.08 it is leased at once.
        net = fs.Net(0, 1e9, 0, 20, long_poll_ms=100)
        for a_time, lease in ((0.06, 0.07), (0.08, 0.08), (0.03, 0.03), (0.2, 0.2)):
            tasks = [task(0, 0, [], a_time), task(1, 1, [0], 0.01)]
            r = fs.Simulation(tasks, [0, 1], 2, net, "star").run()
            self.assertAlmostEqual(r.start[0], 0.0)
            self.assertAlmostEqual(r.start[1], lease, msg=f"A ends at {a_time}")

    def test_owners(self):
        self.assertEqual(fs.block_owners(8, 4), [0, 0, 1, 1, 2, 2, 3, 3])
        self.assertEqual(fs.block_owners(8, 3, "round-robin"), [0, 1, 2, 0, 1, 2, 0, 1])
        self.assertEqual(fs.block_owners(4, 8), [0, 2, 4, 6])

    def test_a_worker_runs_its_lowest_ready_id_first(self):
        tasks = [task(i, 0, [], 0.01 * (3 - i)) for i in range(3)] + [task(3, 1, [2], 0.01)]
        r = fs.Simulation(tasks, [0, 0], 1, zero_net(), "star").run()
        self.assertEqual(sorted(range(4), key=lambda i: r.start[i]), [0, 1, 2, 3])

    # -- the worker tree as built (engine/tree_reduce.h, engine/span_tree.h, worker/peer.cc)
    def test_span_tree(self):
        nodes, leaf = fs.span_tree(5)
        self.assertEqual(nodes[0], (0, 5, -1))
        self.assertEqual(sorted((lo, hi) for lo, hi, _ in nodes),
                         [(0, 1), (0, 2), (0, 5), (1, 2), (2, 3), (2, 5), (3, 4), (3, 5), (4, 5)])
        self.assertEqual([nodes[leaf[s]][:2] for s in range(5)], [(s, s + 1) for s in range(5)])
        self.assertEqual([fs.param_parent(i) for i in range(1, 8)], [0, 1, 2, 3, 4, 5, 6])

    def test_groups_and_partials(self):
        shape = fs.Shape(*FIXTURE_SHAPE)
        K, L, VD = shape.K, fs.F32 * shape.layer_params(), fs.F32 * shape.embed_params()
        g = fs.tree_groups(shape)
        self.assertEqual(list(g), list(range(K)) + [fs.HEAD, fs.LOOKUP, fs.NORM_F])
        self.assertEqual(g, dict({k: L for k in range(K)}, head=VD, lookup=VD,
                                 norm_f=fs.F32 * shape.D))
        self.assertEqual(fs.partial_bytes(shape, ("fwd", K - 1, 2)),
                         {fs.HEAD: VD, fs.NORM_F: fs.F32 * shape.D})
        self.assertEqual(fs.partial_bytes(shape, ("bwd", 1, 2)), {1: L})
        self.assertEqual(fs.partial_bytes(shape, ("bwd", 0, 0)), {0: L, fs.LOOKUP: VD})
        self.assertEqual(fs.partial_bytes(shape, ("fwd", 0, 1)), {})
        self.assertEqual(fs.partial_bytes(shape, ("bwd_summary", 0, 1)), {})

    def small_plan(self, S=8, times=None):
        shape = fs.Shape(64, 3, 8, 512, 2)
        plan = plan_of(S * 512, 256, S, shape.K)
        rng = random.Random(11)
        tasks = fs.plan_tasks(plan, shape, times or (lambda *_: rng.uniform(0.001, 0.01)),
                              shape.param_bytes())
        return shape, plan, tasks

    def test_tree_right_child_goes_to_its_parents_owner(self):
        # Span 1's leaf is done at worker 1 at 0.1; node [1, 2) reaches worker 0, the owner of
        # its parent [0, 2), at 0.15 (B / bw = 0.05), and the root goes to the coordinator: 0.2.
        net = fs.Net(0, 8.0, 0, 0)
        B = 0.05 * net.bw
        tasks = [task(0, 0, [], 0.01, partials={0: B}), task(1, 1, [], 0.1, partials={0: B})]
        r = fs.Simulation(tasks, [0, 1], 2, net, "tree", groups={0: B}).run()
        self.assertAlmostEqual(r.step_s, 0.2, places=9)
        self.assertEqual([x[:5] for x in r.sends], [(0, 1, 2, 1, 0)])
        self.assertEqual([x[:2] for x in r.roots], [(0, 0)])
        r = fs.Simulation(tasks, [0, 1], 2, net, "star").run()
        self.assertAlmostEqual(r.step_s, 0.15, places=9)  # both partials into one link

    def test_tree_one_worker_moves_no_partial_between_workers(self):
        shape, plan, tasks = self.small_plan()
        P, groups = shape.param_bytes(), fs.tree_groups(shape)
        r = fs.simulate(tasks, plan.S, 1, zero_net(), "tree", shape)
        self.assertEqual(r.sends, [])
        # the tied (V, D) pair's roots as one
        roots = [g for g in groups if g not in (fs.HEAD, fs.LOOKUP)] + [fs.TIED]
        self.assertEqual(sorted((str(g), w) for g, w, _ in r.roots),
                         sorted((str(g), 0) for g in roots))
        self.assertEqual(len(r.roots), shape.K + 2)
        small = sum(t.bytes_in + t.bytes_out for t in tasks)
        # the coordinator: the parameters down once, the K + 2 roots up (one gradient), the
        # tasks' own bytes
        self.assertAlmostEqual(r.coord_bytes, small + 2 * P, delta=1)

    def test_tree_crossings_by_owners(self):
        shape, plan, tasks = self.small_plan(S=8)
        groups = fs.tree_groups(shape)
        for how, want in (("block", [(4, 8, 1, 0)]),
                          ("round-robin", [(1, 2, 1, 0), (3, 4, 1, 0), (5, 6, 1, 0),
                                           (7, 8, 1, 0)])):
            r = fs.simulate(tasks, plan.S, 2, zero_net(), "tree", shape, how=how)
            for g in groups:
                got = sorted(x[1:5] for x in r.sends if x[0] == g)
                self.assertEqual(got, want, (how, g))
            self.assertEqual(len(r.sends), len(groups) * len(want))
            self.assertEqual(sorted(w for _, w, _ in r.roots), [0] * (len(groups) - 1))

    def test_tree_sends_go_where_tree_reduce_sends(self):
        # Every node crossing workers: [lo, hi) from the owner of lo to the owner of its
        # parent's lo, for any owners (here random, with some workers owning nothing).
        shape, plan, tasks = self.small_plan(S=13)
        rng = random.Random(5)
        for _ in range(4):
            owner = [rng.randrange(6) for _ in range(plan.S)]
            r = fs.Simulation(tasks, owner, 6, zero_net(), "tree", fs.tree_groups(shape)).run()
            nodes, _ = fs.span_tree(plan.S)
            lo_of = {(lo, hi): nodes[p][0] for lo, hi, p in nodes if p >= 0}
            want = sorted((lo, hi, owner[lo], owner[lo_of[(lo, hi)]]) for lo, hi, p in nodes
                          if p >= 0 and owner[lo] != owner[lo_of[(lo, hi)]])
            for g in fs.tree_groups(shape):
                self.assertEqual(sorted(x[1:5] for x in r.sends if x[0] == g), want)
            first = sorted({w: owner.index(w) for w in set(owner)}.items(), key=lambda x: x[1])
            self.assertEqual(r.tree_order, [w for w, _ in first])

    def test_tree_parameters_before_any_task(self):
        shape, plan, tasks = self.small_plan(S=16)
        net = fs.Net(10, 10, 50, 20)
        piece = min(shape.param_bytes(), fs.PARAM_PIECE_BYTES) / net.bw
        for how in ("block", "round-robin"):
            for W in (1, 2, 3, 5, 8, 16, 32):
                r = fs.simulate(tasks, plan.S, W, net, "tree", shape, how=how)
                owner = fs.block_owners(plan.S, W, how)
                active = set(owner)
                self.assertEqual(sorted(r.tree_order), sorted(active))
                for w in range(W):
                    self.assertEqual(r.params_at[w] is not None, w in active, (how, W, w))
                for t in tasks:  # no task computes before its worker's whole copy is in
                    self.assertGreaterEqual(r.began[t.id], r.params_at[owner[t.span]])
                order = r.tree_order
                for i in range(1, len(order)):  # a relay: a piece after its predecessor's
                    self.assertGreaterEqual(r.params_at[order[i]], r.params_at[order[
                        fs.param_parent(i)]] + piece - 1e-12, (how, W, i))

    def test_tree_relays_the_copy_down_the_chain(self):
        # 4 workers, a copy of 10 pieces taking 1 s on a link, no latency or overhead: worker 0
        # has it at 1.0; worker i streams from worker i - 1 from the moment that one's stream
        # began (all at 0, each on its own pair of links) and, relaying, ends a piece after
        # it: 1.1, 1.2, 1.3 (a binomial tree's root would send two copies one after the
        # other, its last grandchild done at 2.1; a store-and-forward chain at 4.0).
        P = 10 * fs.PARAM_PIECE_BYTES
        net = fs.Net(0, P * 8 / 1e9, 0, 0)
        tasks = [task(i, i, [], 0.01, P=P) for i in range(4)]
        r = fs.Simulation(tasks, [0, 1, 2, 3], 4, net, "tree").run()
        for w, at in enumerate((1.0, 1.1, 1.2, 1.3)):
            self.assertAlmostEqual(r.params_at[w], at, places=9)
            self.assertAlmostEqual(r.began[w], at, places=9)
        self.assertAlmostEqual(r.step_s, 1.31, places=9)
        self.assertAlmostEqual(r.worker_time[3]["params"], 1.3, places=9)
        # every link carries the copy once: each worker's out link one copy, the last's none
        self.assertEqual(r.worker_out_bytes, [P, P, P, 0])
        self.assertEqual(r.coord_bytes, P)

    def test_tree_chain_with_latency_and_overhead(self):
        # Worker i's request reaches worker i - 1 at lat + ovh after its lease's reply (all
        # leased at once: the same moment), its stream starts lat + ovh after worker i - 1's
        # began; each ends max(its stream's end, the predecessor's + a piece + lat).
        P = 10 * fs.PARAM_PIECE_BYTES
        for ovh_us in (0.0, 50e3, 300e3):  # the overhead below and above a piece's 0.1 s
            net = fs.Net(20e3, P * 8 / 1e9, ovh_us, 0)  # inside the long poll: leased at 0
            lat, ovh = net.lat, net.ovh
            piece = fs.PARAM_PIECE_BYTES / net.bw
            tasks = [task(i, i, [], 0.01, P=P) for i in range(5)]
            r = fs.Simulation(tasks, list(range(5)), 5, net, "tree").run()
            asked = 2 * lat + ovh  # the lease's reply and the FetchParams request
            start, done = asked, asked + 1.0 + lat  # worker 0's, from the coordinator
            self.assertAlmostEqual(r.params_at[0], done, places=9)
            for w in range(1, 5):
                start += lat + ovh
                done = max(start + 1.0 + lat, done + piece + lat)
                self.assertAlmostEqual(r.params_at[w], done, places=9, msg=(ovh_us, w))
                self.assertGreater(r.params_at[w], r.params_at[w - 1])
            self.assertEqual(r.worker_out_bytes, [P, P, P, P, 0])

    def test_tree_step_never_below_the_critical_path(self):
        for S in (8, 13):
            shape, plan, tasks = self.small_plan(S=S)
            _, cp = fs.critical_path(tasks)
            for net in (zero_net(), fs.Net(10, 100, 50, 20), fs.Net(50, 1, 100, 0, 0)):
                for how in ("block", "round-robin"):
                    for W in (1, 2, 3, 4, 8, 16):
                        r = fs.simulate(tasks, plan.S, W, net, "tree", shape, how=how)
                        self.assertGreaterEqual(r.step_s, cp - 1e-12, (S, how, W))
                        self.assertGreaterEqual(r.step_s, max(t for _, _, t in r.roots))
                        self.assertEqual(len(r.roots), shape.K + 2)

    def big_partials(self):
        shape = fs.Shape(256, 4, 16, 32000, 2)
        plan = plan_of(65536, 1024, 16, shape.K)
        tasks = fs.plan_tasks(plan, shape, lambda *_: 0.01, shape.param_bytes())
        return shape, plan, tasks, fs.Net(10, 10, 50, 0)

    def test_star_is_slower_than_tree_for_large_partials(self):
        shape, plan, tasks, net = self.big_partials()
        for W in (4, 8, 16):
            star = fs.simulate(tasks, plan.S, W, net, "star", shape)
            tree = fs.simulate(tasks, plan.S, W, net, "tree", shape)
            self.assertGreater(star.step_s, 1.2 * tree.step_s, W)
            self.assertGreater(star.coord_busy, 2 * tree.coord_busy, W)

    def test_tree_traffic(self):
        shape, plan, tasks, net = self.big_partials()
        P, groups = shape.param_bytes(), fs.tree_groups(shape)
        small = sum(t.bytes_in + t.bytes_out for t in tasks)  # summaries, halos, tokens
        for how in ("block", "round-robin"):
            for W in (2, 5, 8, 16):
                owner = fs.block_owners(plan.S, W, how)
                tree = fs.simulate(tasks, plan.S, W, net, "tree", shape, how=how)
                star = fs.simulate(tasks, plan.S, W, net, "star", shape, how=how)
                # coordinator: the parameters down once, the roots up once (one gradient:
                # the tied pair's as one)
                self.assertAlmostEqual(tree.coord_bytes, small + 2 * P, delta=1)
                # star: every worker's parameters and every span's partials
                parts = sum(sum(t.partials.values()) for t in tasks)
                self.assertAlmostEqual(star.coord_bytes, small + W * P + parts, delta=1)
                # each worker: its tasks' bytes, its copy in, one copy out unless it is the
                # chain's last, the sums it sends and receives, and (worker 0) the roots
                order, A = tree.tree_order, len(tree.tree_order)
                for i, w in enumerate(order):
                    mine = sum(t.bytes_in + t.bytes_out for t in tasks if owner[t.span] == w)
                    children = sum(1 for c in range(1, A) if fs.param_parent(c) == i)
                    self.assertEqual(children, 0 if i == A - 1 else 1)
                    sums = sum(groups[g] for g, _, _, x, y, _, _ in tree.sends if w in (x, y))
                    roots = sum(groups.get(g, groups[fs.HEAD]) for g, x, _ in tree.roots
                                if x == w)
                    self.assertAlmostEqual(tree.worker_bytes[w],
                                           mine + P * (1 + children) + sums + roots,
                                           delta=1, msg=(how, W, w))

    def test_wavefront_runs_at_most_K_at_once(self):
        shape = fs.Shape(64, 3, 8, 256, 2)
        plan = plan_of(8192, 512, 0, shape.K)
        cost = fs.CostModel({p: 1e-9 for p in fs.PHASES + ("head",)}, "test")
        tasks, forward = fs.wavefront_tasks(shape, plan, cost, 1.0, "none")
        net = zero_net()
        t = tasks[0].time
        steps = {W: fs.Simulation(tasks, [], W, net, "star").run().step_s for W in (1, 3, 6)}
        self.assertAlmostEqual(steps[1], forward + len(tasks) * t, places=9)
        self.assertAlmostEqual(steps[3], forward + (plan.nC + shape.K - 1) * t, places=9)
        self.assertAlmostEqual(steps[6], steps[3], places=9)
        self.assertGreater(forward, 0)


class CalibrateTest(unittest.TestCase):
    def test_lad_fit_ignores_an_outlier(self):
        rows = [(2.0, mb, 2 * 3e-4 + 1e-3 * mb) for mb in (0.0, 0.1, 0.5, 1.0, 2.0, 4.0)]
        rows += [(1.0, 0.0, 3e-4)] * 3 + [(2.0, 1.0, 0.5)]  # a descheduled process
        x, inv = fs.lad_fit(rows)
        self.assertAlmostEqual(x, 3e-4, delta=3e-6)
        self.assertAlmostEqual(inv, 1e-3, delta=1e-5)

    def test_fit_recovers_a_simulated_run(self):
        shape = fs.Shape(*FIXTURE_SHAPE)
        plan = plan_of(16384, 256, 8, shape.K)
        rng = random.Random(3)
        P = shape.param_bytes()
        tasks = fs.plan_tasks(plan, shape, lambda *_: rng.uniform(0.002, 0.01), P)
        for t in tasks:
            t.bytes_out += rng.randint(0, 2_000_000)  # spread the sizes for the bandwidth
        net = fs.Net(5, 2.0, 300, 20)
        owner = fs.block_owners(plan.S, 2)
        r = fs.Simulation(tasks, owner, 2, net, "star").run()
        firsts = {}
        for t in sorted(tasks, key=lambda t: r.start[t.id]):
            firsts.setdefault(owner[t.span], t.id)
        recs = [{"id": t.id, "deps": t.deps, "start_s": r.start[t.id], "end_s": r.end[t.id],
                 "compute_s": t.time, "rebuild_s": 0.0, "worker": f"w{owner[t.span]}",
                 "bytes_in": t.bytes_in + (P if t.id in firsts.values() else 0),
                 "bytes_out": t.bytes_out + sum(t.partials.values())} for t in tasks]
        x, inv = fs.lad_fit(fs.fit_rows(recs))
        self.assertAlmostEqual(x, 2 * 5e-6 + 300e-6, delta=5e-6)
        self.assertAlmostEqual(8e6 / inv / 1e9, 2.0, delta=0.05)


    def test_held_bandwidth_fits_the_overhead_alone(self):
        # Tasks whose bytes are too alike to fit a bandwidth: the link's rate held, the
        # overhead is the weighted median, and a descheduled process does not move it.
        rows = [(2.0, 0.01, 2 * 3e-4 + 8e-3 / 10 * 0.01)] * 5 + [(1.0, 0.0, 3e-4)] * 3
        rows += [(2.0, 0.01, 0.5)]
        self.assertAlmostEqual(fs.lad_fit_held(rows, 8e-3 / 10), 3e-4, delta=1e-9)


class CliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.trace = write_trace(self.dir, fixture_records())

    def tearDown(self):
        self.tmp.cleanup()

    def assertUserError(self, p, text):
        assert_user_error(self, p, text)

    def test_help(self):
        for args in ((), ("replay",), ("calibrate",), ("synth",)):
            p = cli(*args, "--help")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("usage:", p.stdout)

    def test_replay_table_and_json(self):
        out = os.path.join(self.dir, "r.json")
        p = cli("replay", "--trace", self.trace, "--workers", "1,2,4", "--json", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("| W | star step s", p.stdout)
        self.assertIn("D=16,K=3,N=4,V=256,E=2", p.stdout)  # inferred
        rows = read_json(out)["rows"]
        self.assertEqual([r["W"] for r in rows], [1, 2, 4])
        self.assertAlmostEqual(rows[0]["star"]["speedup"], 1.0)
        self.assertAlmostEqual(rows[0]["tree"]["efficiency"], 1.0)

    def test_calibrate_and_synth_run(self):
        p = cli("calibrate", "--trace", f"{self.trace}:2", "--trace", f"{self.trace}:2:0.07")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("--rpc-overhead-us", p.stdout)
        self.assertEqual(p.stdout.count("| trace.jsonl | 2 |"), 2)
        need_adjsh()  # synth's plan is the binary's
        out = os.path.join(self.dir, "s.json")
        p = cli("synth", "--model", "64,2,8,512,2", "--T", "16384", "--chunk", "512",
                "--cost-trace", self.trace, "--speed", "2", "--workers", "1,4", "--json", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = read_json(out)
        self.assertEqual(got["spans"], 8)
        self.assertIn("wavefront", got["rows"][1])
        self.assertGreater(got["parallelism"], 1.0)

    def test_held_bandwidth_and_recorded_owners(self):
        p = cli("calibrate", "--trace", f"{self.trace}:2:0.07", "--bandwidth-gbps", "10")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("--bandwidth-gbps 10 (held)", p.stdout)
        out = os.path.join(self.dir, "r.json")
        p = cli("replay", "--trace", self.trace, "--workers", "2", "--owners", "recorded",
                "--reduce", "tree", "--json", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        recorded = read_json(out)["rows"][0]["tree"]["step_s"]
        # The fixture's owners are SpanPlan's block owners: the same step as --owners block.
        p = cli("replay", "--trace", self.trace, "--workers", "2", "--reduce", "tree",
                "--json", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertAlmostEqual(read_json(out)["rows"][0]["tree"]["step_s"], recorded, places=9)
        self.assertUserError(cli("replay", "--trace", self.trace, "--workers", "4",
                                 "--owners", "recorded"), "--workers 2")
        self.assertUserError(cli("calibrate", "--trace", f"{self.trace}:2",
                                 "--bandwidth-gbps", "0"), "must be positive")

    def test_bad_input(self):
        self.assertUserError(cli("replay", "--trace", os.path.join(self.dir, "none")),
                             "No such file")
        self.assertUserError(cli("replay", "--trace", self.trace, "--workers", "1,x"),
                             "--workers")
        self.assertUserError(cli("replay", "--trace", self.trace, "--model", "1,2"),
                             "D,K,N,V,E")
        self.assertUserError(cli("replay", "--trace", self.trace, "--model", "16,2,4,256,2"),
                             "K=2")
        bad = os.path.join(self.dir, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"step": 0}\nnot json\n')
        self.assertUserError(cli("replay", "--trace", bad), "not a task trace line")
        twice = write_trace(self.dir, fixture_records() * 2, "twice.jsonl")
        self.assertUserError(cli("replay", "--trace", twice), "appears twice")
        self.assertUserError(cli("calibrate", "--trace", f"{self.trace}:3"), "2 workers")
        self.assertUserError(cli("calibrate", "--trace", self.trace), "FILE:W")
        if os.access(ADJSH, os.X_OK):  # the binary's plan refuses the shape, naming the flag
            self.assertUserError(cli("synth", "--model", "64,2,8,512,2", "--T", "1000",
                                     "--chunk", "512", "--spans", "4", "--cost-trace",
                                     self.trace, "--speed", "1"), "--spans 4")
        # the tree's root is the first span's owner, as built: no option chooses it
        self.assertUserError(cli("replay", "--trace", self.trace, "--tree-root", "last"),
                             "unrecognized arguments")


class LiveTraceTest(unittest.TestCase):
    """Fresh traces of the binary: the plan, the bytes, the in-process trace's handling, and the
    worker tree's traffic against what the simulator's tree sends."""

    @classmethod
    def setUpClass(cls):
        if not os.access(ADJSH, os.X_OK):
            raise unittest.SkipTest(f"no adjsh binary at {ADJSH}")
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        def run(*args):
            p = subprocess.run([ADJSH, *args], capture_output=True, text=True, cwd=d)
            if p.returncode != 0:
                raise AssertionError(f"adjsh {' '.join(args)}: {p.stderr[-1500:]}")
            return p
        run("init", "--out", "m", "--hidden-size", "16", "--layers", "2", "--vocab-size", "256",
            "--state-size", "4")
        run("tokenize", "--text", CORPUS, "--out", "t.u32", "--length", "1200")
        common = ["grad", "--model", "m", "--tokens", "t.u32", "--out", "g.st", "--chunk", "64",
                  "--spans", "5", "--quiet"]
        run(*common, "--workers", "3", "--reduce", "star", "--trace", "w3.jsonl")
        cls.tree_log = run(*common, "--workers", "3", "--reduce", "tree",
                           "--trace", "w3_tree.jsonl").stderr
        run(*common, "--trace", "in.jsonl")
        cls.w3 = os.path.join(d, "w3.jsonl")
        cls.w3_tree = os.path.join(d, "w3_tree.jsonl")
        cls.inproc = os.path.join(d, "in.jsonl")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_worker_trace_matches_plan_and_bytes(self):
        recs, _ = fs.load_trace(self.w3)
        self.assertTrue(fs.carries_partials(recs))
        shape = fs.infer_shape(recs)
        self.assertEqual(repr(shape), "D=16,K=2,N=4,V=256,E=2")
        check_records_against_plan(self, recs, shape, 64)

    def test_tree_trace_matches_plan_and_bytes(self):
        recs, _ = fs.load_trace(self.w3_tree)
        self.assertFalse(fs.carries_partials(recs))
        with self.assertRaises(fs.FleetError):
            fs.infer_shape(recs)  # without the partials the bytes do not give V
        check_records_against_plan(self, recs, fs.Shape(16, 2, 4, 256, 2), 64, tree=True)
        assert_user_error(self, cli("replay", "--trace", self.w3_tree), "--model")
        p = cli("replay", "--trace", self.w3_tree, "--model", "16,2,4,256,2", "--workers", "1,3")
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_tree_traffic_is_the_workers(self):
        # Each worker logs what it sent and received in the tree: the simulated tree at the
        # recorded owners sends the same (as a multiset over the workers).
        import re
        got = sorted(tuple(int(x) for x in m) for m in re.findall(
            r"tree: (\d+) sums sent, (\d+) received, (\d+) roots, parameters \d+ from the "
            r"tree, \d+ from the coordinator, (\d+) relayed", self.tree_log))
        self.assertEqual(len(got), 3, self.tree_log[-2000:])
        recs, _ = fs.load_trace(self.w3_tree)
        shape = fs.Shape(16, 2, 4, 256, 2)
        owner, W = fs.recorded_owners(recs, recs[0]["spans"])
        tasks = fs.trace_tasks(recs, shape, 1.0, None, None)
        r = fs.simulate(tasks, len(owner), W, fs.Net(5, 10, 50, 20), "tree", shape, owner=owner)
        order = r.tree_order
        want = sorted((sum(1 for x in r.sends if x[3] == w), sum(1 for x in r.sends if x[4] == w),
                       sum(1 for x in r.roots if x[1] == w),
                       sum(1 for c in range(1, len(order)) if fs.param_parent(c) == i))
                      for i, w in enumerate(order))
        self.assertEqual(got, want, self.tree_log[-4000:])

    def test_in_process_trace(self):
        recs, _ = fs.load_trace(self.inproc)
        self.assertFalse(fs.has_bytes(recs))
        check_records_against_plan(self, recs, fs.Shape(16, 2, 4, 256, 2), 64)
        assert_user_error(self, cli("replay", "--trace", self.inproc), "--model")
        p = cli("replay", "--trace", self.inproc, "--model", "16,2,4,256,2", "--chunk", "64",
                "--workers", "1,5")
        self.assertEqual(p.returncode, 0, p.stderr)


if __name__ == "__main__":
    if "--adjsh" in sys.argv:
        i = sys.argv.index("--adjsh")
        ADJSH = os.path.abspath(sys.argv[i + 1])
        del sys.argv[i:i + 2]
    # the same binary for the plans made here and in fleet_sim.py's processes
    os.environ["ADJSH"] = ADJSH
    fs.set_adjsh(ADJSH)
    unittest.main(verbosity=2)
