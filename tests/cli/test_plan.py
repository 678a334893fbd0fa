#!/usr/bin/python3
"""Checks of `adjsh plan` (cli/plan_cmd.cc): the span plan of a step (engine/span_plan.h) as JSON.

Usage:
  /usr/bin/python3 tests/cli/test_plan.py --adjsh build/cli/adjsh [unittest flags]

Standard library only. What is checked:
  help      `adjsh plan --help` lists its flags; the top-level --help lists the command;
  usage     bad flags are refused with exit 2, nothing on stdout and a message naming the flag
            (unknown, missing, not an integer, out of range, --model with --layers, a shape
            the plan cannot make, a plan too large to print); an unreadable --model is exit 1;
  plan      for small shapes: the spans are runs of whole chunks covering [0, T) in order with
            halo min(W - 1, t0), the chunks cover [0, T), the tasks are in the order
            engine/span_plan.h documents (per layer fwd_summary(k, s) for s < S-1 and fwd(k, s);
            then from the top layer bwd_summary(k, s) for s > 0 and bwd(k, s), S-1 first) with
            the dependencies it documents (what each task reads), each span's first task is
            its lowest id; --spans 0 gives the default count; --forward-only the forward's
            tasks with their full-plan ids; --model reads K and W from a Mamba or a Mamba-2
            config; and the plan is the one `adjsh grad --trace` runs (its trace's ids, phases
            and deps).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unittest

ADJSH = None
CORPUS = "/usr/share/common-licenses/GPL-3"
CRASH_MARKERS = ("Segmentation fault", "terminate called", "Aborted", "core dumped")
FWD_SUMMARY, FWD, BWD_SUMMARY, BWD = "fwd_summary", "fwd", "bwd_summary", "bwd"


def run(*args, cwd=None):
    p = subprocess.run([ADJSH, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


def plan(T, C, S, K, W=4, *extra):
    rc, out, err = run("plan", "--context", T, "--chunk", C, "--spans", S, "--layers", K,
                       "--conv-kernel", W, *extra)
    if rc != 0:
        raise AssertionError(f"adjsh plan T={T} C={C} S={S} K={K} W={W}: exit {rc}: {err}")
    return json.loads(out)


def documented_tasks(K, S, forward_only=False):
    """The task order engine/span_plan.h documents: (phase, layer, span) by id."""
    tasks = []
    for k in range(K):
        tasks += [(FWD_SUMMARY, k, s) for s in range(S - 1)]
        tasks += [(FWD, k, s) for s in range(S)]
    if not forward_only:
        for k in range(K - 1, -1, -1):
            tasks += [(BWD_SUMMARY, k, s) for s in range(S - 1, 0, -1)]
            tasks += [(BWD, k, s) for s in range(S - 1, -1, -1)]
    return tasks


def documented_reads(task, K, S):
    """What engine/span_plan.h says a task reads, as (phase, layer, span) of the tasks that make
    it (those that exist): a forward task u^k of its span and the conv halo from the span
    before (fwd(k-1, s), fwd(k-1, s-1)); fwd(k, s) also h0(k, s), combined from the summaries
    of the spans up to its own; a backward task dL/du^{k+1} of its span and the halo part from
    the span after (bwd(k+1, s), bwd(k+1, s+1)), or at the top the head's (fwd(K-1, s));
    bwd(k, s) also mu(k, s), combined from the summaries of the spans from the last to its own."""
    phase, k, s = task
    if phase in (FWD_SUMMARY, FWD):
        reads = [(FWD, k - 1, s), (FWD, k - 1, s - 1)]
        if phase == FWD:
            reads += [(FWD_SUMMARY, k, s2) for s2 in range(s + 1)]
    else:
        reads = [(FWD, k, s)] if k + 1 == K else [(BWD, k + 1, s), (BWD, k + 1, s + 1)]
        if phase == BWD:
            reads += [(BWD_SUMMARY, k, s2) for s2 in range(s, S)]
    return reads


class HelpTest(unittest.TestCase):
    def test_help(self):
        rc, out, err = run("plan", "--help")
        self.assertEqual(rc, 0, err)
        self.assertIn("usage: adjsh plan", out)
        for flag in ("--context", "--chunk", "--spans", "--layers", "--conv-kernel", "--model",
                     "--forward-only"):
            self.assertIn(flag, out)
        rc, out, _ = run("--help")
        self.assertEqual(rc, 0)
        self.assertIn("  plan ", out)


class UsageTest(unittest.TestCase):
    def refused(self, args, words, code=2):
        rc, out, err = run("plan", *args)
        self.assertEqual(rc, code, (args, err))
        self.assertEqual(out, "", args)
        first = err.splitlines()[0] if err else ""  # the message (the usage may follow)
        for w in words:
            self.assertIn(w, first, args)
        for m in CRASH_MARKERS:
            self.assertNotIn(m, err)

    def test_bad_flags(self):
        ok = ["--context", "1000", "--layers", "2"]
        self.refused(ok + ["--bogus", "1"], ["--bogus"])
        self.refused(["--layers", "2"], ["--context"])                  # missing
        self.refused(["--context", "1000"], ["--layers"])                # missing (or --model)
        self.refused(ok + ["--chunk"], ["--chunk"])                      # no value
        self.refused(["--context", "abc", "--layers", "2"], ["--context", "abc"])
        self.refused(["--context", "0", "--layers", "2"], ["--context"])
        self.refused(ok + ["--chunk", "0"], ["--chunk"])
        self.refused(ok + ["--spans", "-1"], ["--spans"])
        self.refused(["--context", "1000", "--layers", "0"], ["--layers"])
        self.refused(["--context", "1000", "--layers", "1025"], ["--layers"])
        self.refused(ok + ["--conv-kernel", "0"], ["--conv-kernel"])
        self.refused(ok + ["--forward-only=maybe"], ["--forward-only"])
        self.refused(ok + ["stray"], ["stray"])

    def test_shapes_the_plan_cannot_make(self):
        # 1000 tokens in chunks of 64 are 16 chunks: 17 spans cannot be made of whole chunks
        self.refused(["--context", "1000", "--chunk", "64", "--spans", "17", "--layers", "2"],
                     ["--spans 17", "16"])
        # a span shorter than the conv halo W - 1 that the next span reads
        self.refused(["--context", "10", "--chunk", "1", "--spans", "4", "--layers", "1"],
                     ["--spans 4", "W - 1"])
        self.refused(["--context", "40", "--chunk", "4", "--spans", "10", "--layers", "1",
                      "--conv-kernel", "6"], ["--spans 10", "W - 1 = 5"])
        # too large to print: the chunk list, or K S^2 dependencies
        self.refused(["--context", str(1 << 30), "--chunk", "1", "--layers", "1"], ["--chunk"])
        self.refused(["--context", str(1 << 30), "--chunk", "1024", "--spans", "65536",
                      "--layers", "24"], ["--spans 65536"])

    def test_model_flag(self):
        self.refused(["--context", "1000", "--model", "/no/such/model", "--layers", "2"],
                     ["--layers", "--model"])
        self.refused(["--context", "1000", "--model", "/no/such/model"], ["/no/such/model"],
                     code=1)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                f.write("{not json")
            self.refused(["--context", "1000", "--model", d], ["config.json"], code=1)


class PlanTest(unittest.TestCase):
    SHAPES = ((1000, 64, 5, 2, 4), (512, 64, 4, 3, 4), (250, 20, 4, 3, 7), (40, 10, 2, 2, 4),
              (333, 20, 1, 2, 4), (100, 256, 0, 1, 4), (7, 3, 3, 2, 3))

    def check_plan(self, j, T, C, S, K, W, forward_only=False):
        C = min(C, T)
        nC = -(-T // C)
        self.assertEqual((j["T"], j["chunk"], j["num_chunks"], j["layers"], j["conv_kernel"],
                          j["forward_only"]), (T, C, nC, K, W, forward_only))
        if S:
            self.assertEqual(j["num_spans"], S)
        S = j["num_spans"]
        self.assertEqual(j["phases"], [FWD_SUMMARY, FWD, BWD_SUMMARY, BWD])
        # the spans: runs of whole chunks covering [0, T) in order
        spans = j["spans"]
        self.assertEqual([r["index"] for r in spans], list(range(S)))
        self.assertEqual(spans[0]["c0"], 0)
        self.assertEqual(spans[-1]["c1"], nC)
        t = 0
        for s, r in enumerate(spans):
            self.assertLess(r["c0"], r["c1"], s)
            if s:
                self.assertEqual(r["c0"], spans[s - 1]["c1"])
            self.assertEqual(r["t0"], t)
            self.assertEqual(r["t0"], r["c0"] * C)
            self.assertEqual(r["t0"] + r["len"], min(T, r["c1"] * C))
            self.assertEqual(r["halo"], min(W - 1, r["t0"]))
            if 0 < s < S - 1:  # its halo for the next span fits in it
                self.assertGreaterEqual(r["len"], W - 1)
            t += r["len"]
        self.assertEqual(t, T)
        # the chunks cover [0, T)
        chunks = j["chunks"]
        self.assertEqual([(c["index"], c["t0"], c["len"], c["halo"]) for c in chunks],
                         [(c, c * C, min(C, T - c * C), min(W - 1, c * C)) for c in range(nC)])
        # the tasks: the documented order, and what each reads
        tasks = [(x["phase"], x["layer"], x["span"]) for x in j["tasks"]]
        self.assertEqual([x["id"] for x in j["tasks"]], list(range(len(tasks))))
        self.assertEqual(tasks, documented_tasks(K, S, forward_only))
        self.assertEqual(j["num_tasks"], len(tasks))
        self.assertEqual(len(tasks), K * ((2 * S - 1) if forward_only else (4 * S - 2)))
        index = {x: i for i, x in enumerate(tasks)}
        full = {x: i for i, x in enumerate(documented_tasks(K, S))}
        for i, x in enumerate(j["tasks"]):
            deps = x["deps"]
            self.assertEqual(deps, sorted(set(deps)), i)
            self.assertTrue(all(0 <= d < i for d in deps), i)
            want = sorted({full[r] for r in documented_reads(tasks[i], K, S) if r in full})
            self.assertEqual(deps, want, f"deps of task {i} {tasks[i]}")
            self.assertEqual(index[tasks[i]], full[tasks[i]])  # forward-only: the full plan's ids
        # each span's first task: its lowest id (fwd_summary(0, s), or fwd(0, S-1))
        for s, r in enumerate(spans):
            self.assertEqual(r["first_task"], min(i for i, x in enumerate(tasks) if x[2] == s))
            self.assertEqual(tasks[r["first_task"]], (FWD_SUMMARY if s + 1 < S else FWD, 0, s))

    def test_small_shapes(self):
        for shape in self.SHAPES:
            with self.subTest(shape=shape):
                self.check_plan(plan(*shape), *shape)

    def test_forward_only(self):
        for shape in self.SHAPES[:4]:
            with self.subTest(shape=shape):
                self.check_plan(plan(*shape, "--forward-only"), *shape, forward_only=True)

    def test_default_spans(self):
        # about T / 16384, at least 8, at most one per chunk (engine/span_plan.h)
        for T, C, want in ((65536, 1024, 8), (1 << 20, 4096, 64), (2048, 1024, 2),
                           (100, 256, 1)):
            j = plan(T, C, 0, 2)
            self.assertEqual(j["num_spans"], want, (T, C))
            self.check_plan(j, T, C, 0, 2, 4)
        self.assertEqual(plan(10, 1, 0, 1)["num_spans"], 3)  # every span after the first >= W-1

    def test_output_is_one_json_object_on_stdout(self):
        rc, out, err = run("plan", "--context", "512", "--chunk", "64", "--layers", "2")
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")
        self.assertIsInstance(json.loads(out), dict)
        self.assertTrue(out.endswith("}\n"))
        # --flag=value works as everywhere
        rc, out2, err = run("plan", "--context=512", "--chunk=64", "--layers=2", "--spans=0")
        self.assertEqual((rc, out2), (0, out), err)


class ModelAndTraceTest(unittest.TestCase):
    """--model reads K and W from a model's config.json; the plan is what `adjsh grad` runs."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def ok(self, *args):
        rc, out, err = run(*args, cwd=self.dir)
        self.assertEqual(rc, 0, f"adjsh {' '.join(map(str, args))}: {err[-1500:]}")
        return out

    def test_model_gives_layers_and_conv_kernel(self):
        self.ok("init", "--out", "m3", "--hidden-size", "16", "--layers", "3", "--vocab-size",
                "64", "--state-size", "4", "--conv-kernel", "3")
        self.ok("init", "--out", "m2", "--model-type", "mamba2", "--hidden-size", "16",
                "--layers", "2", "--vocab-size", "64", "--state-size", "8", "--head-dim", "8",
                "--groups", "2")
        for model, K, W in (("m3", 3, 3), ("m2", 2, 4)):
            got = json.loads(self.ok("plan", "--context", "300", "--chunk", "32", "--spans", "4",
                                     "--model", os.path.join(self.dir, model)))
            self.assertEqual((got["layers"], got["conv_kernel"]), (K, W), model)
            self.assertEqual(got, plan(300, 32, 4, K, W), model)

    def test_the_plan_is_the_one_grad_runs(self):
        self.ok("init", "--out", "m", "--hidden-size", "16", "--layers", "2", "--vocab-size",
                "256", "--state-size", "4")
        self.ok("init", "--out", "m2", "--model-type", "mamba2", "--hidden-size", "16",
                "--layers", "2", "--vocab-size", "256", "--state-size", "8", "--head-dim", "8")
        self.ok("tokenize", "--text", CORPUS, "--out", "t.u32", "--length", "700")
        for model, spans in (("m", "5"), ("m", "0"), ("m2", "5")):
            trace = f"trace-{model}-{spans}.jsonl"
            self.ok("grad", "--model", model, "--tokens", "t.u32", "--out", "g.st", "--chunk",
                    "64", "--spans", spans, "--quiet", "--trace", trace)
            with open(os.path.join(self.dir, trace)) as f:
                recs = sorted((json.loads(line) for line in f if line.strip()),
                              key=lambda r: r["id"])
            j = plan(700, 64, int(spans), 2)
            self.assertEqual(recs[0]["spans"], j["num_spans"], model)
            self.assertEqual([(r["id"], r["phase"], r["layer"], r["span"], r["deps"])
                              for r in recs],
                             [(t["id"], t["phase"], t["layer"], t["span"], t["deps"])
                              for t in j["tasks"]])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--adjsh", required=True)
    a, rest = ap.parse_known_args()
    ADJSH = os.path.abspath(a.adjsh)
    if not os.access(ADJSH, os.X_OK):
        sys.exit(f"test_plan.py: no adjsh binary at {ADJSH} (build it with scripts/build.sh)")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
