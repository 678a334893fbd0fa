#!/usr/bin/python3
"""bench/roofline.py, the GPU roofline model of issue 49: its GEMM count against bench/flops.h
(reproduced here), its model of today's PCIe traffic against the counts measured on the
emulated device, the resident design's PCIe bytes, the 1.27B worker's memory being linear in
its tokens, and its section writer touching nothing else."""
import os
import re
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import roofline  # noqa: E402


def flops_h_executed(D, K, V, R, N, share):
    """bench/flops.h GradientFlopsPerToken(exact, share, kept 0, carried 0).executed, rewritten."""
    Di, Q = 2 * D, R + 2 * N
    in_x = in_z = 2 * D * Di  # in_proj's x and gate halves
    x_proj, dt_proj, out_proj = 2 * Di * Q, 2 * R * Di, 2 * Di * D
    forward = in_x + in_z + x_proj + dt_proj + out_proj
    summary_fwd = in_x + x_proj + dt_proj                   # no gate half
    summary_bwd = in_x + in_z + x_proj + dt_proj + out_proj  # recompute and g W_out
    vjp = (forward - out_proj) + 2 * forward                 # recompute, then two GEMMs each
    return K * (forward + share * (summary_fwd + summary_bwd) + vjp) + 3 * 2 * V * D


class GemmFlops(unittest.TestCase):
    def test_flops_h_still_counts_what_this_test_reproduces(self):
        text = roofline.read(os.path.join(ROOT, "bench", "flops.h"))
        for line in ("const double recompute = 2 * D * 2 * Di + 2 * Di * Q + 2 * R * Di;",
                     "const double head = 3 * 2 * V * D;",
                     "const double f1 = recompute - 2 * D * Di;",
                     "const double backward = 2 * forward;"):
            self.assertIn(line, text, "bench/flops.h changed: update this test and roofline.py")

    def test_cuda_gemms_are_flops_h_plus_what_the_cuda_code_does_differently(self):
        for D, K, T in ((768, 24, 65536), (768, 24, 1 << 20), (256, 4, 65536)):
            # W = 1: no conv halo rows, which flops.h does not count (GEMM flops need no W).
            sh = roofline.Shape(D, K, 50280, W=1)
            S = roofline.default_spans(T, sh.C)
            share = (S - 1) / S
            got = sum(o.flops for o in roofline.step_ops(sh, 4, T, S, True) if o.gemm)
            want = (flops_h_executed(D, K, 50280, sh.R, sh.N, share)
                    + K * share * 2 * D * 2 * D  # Recompute runs in_proj's gate half in summaries
                    + 2 * 50280 * D              # the head's pass two recomputes the logits
                    + K * (D + 2 * D)            # beta = 1 adds: out_proj's residual, dx'
                    + 50280 * D * S / T)         # dE's beta = 1 add, once per span
            self.assertAlmostEqual(got / want, 1, places=12, msg=f"D={D} T={T}")
            self.assertAlmostEqual(roofline.flops_h(sh, share)[1] /
                                   flops_h_executed(D, K, 50280, sh.R, sh.N, share), 1, places=12)

    def test_the_scaling_to_mamba_ssm_uses_model_flops(self):
        model = roofline.flops_h(roofline.M130, 0)[0]
        sh = roofline.M130
        forward = 2 * sh.D * 2 * sh.Di + 2 * sh.Di * sh.Q + 2 * sh.R * sh.Di + 2 * sh.Di * sh.D
        self.assertEqual(model, sh.K * 3 * forward + 6 * sh.V * sh.D)


class Pcie(unittest.TestCase):
    def test_todays_model_matches_the_measured_counts(self):
        rows = roofline.cross_check()
        self.assertEqual(len(rows), 4)
        for model, T, S, up_m, down_m, up, down in rows:
            self.assertLess(abs(up - up_m), 1 + 1e-3 * up_m, f"{model} {T} H2D")
            self.assertLess(abs(down - down_m), 1 + 1e-3 * down_m, f"{model} {T} D2H")

    def test_resident_pcie_beyond_parameters_and_gradient_at_1m(self):
        sh, T = roofline.Shape(256, 4, 50280), 1 << 20
        S = roofline.default_spans(T, sh.C)
        params, grad, rest = roofline.pcie_resident(sh, T, S)
        self.assertLess(rest / T, 64)
        f32 = 4 * sh.params()
        self.assertEqual(grad, f32)
        self.assertGreaterEqual(params, f32)  # the blocks' pieces on 256-byte boundaries
        self.assertLess(params, f32 + sh.K * 10 * 256)

    def test_today_moves_rows_every_call_and_resident_does_not(self):
        for T in (65536, 1 << 20):
            today = roofline.design(roofline.M130, 4, T, roofline.H100, False)
            resident = roofline.design(roofline.M130, 4, T, roofline.H100, True)
            self.assertGreater(today["pcie"], 20 * resident["pcie"])
            self.assertLess(resident["t"], today["t"])
            self.assertGreater(resident["dev"], 0)


class Memory(unittest.TestCase):
    def test_a_worker_grows_linearly_with_its_tokens(self):
        sh = roofline.M127B
        for rows, states in ((2, 2), (2, 4), (4, 4)):
            mem = [sum(roofline.worker_memory(sh, n, rows, states).values())
                   for n in range(4096, 4096 + 5 * 8192, 8192)]
            steps = {b - a for a, b in zip(mem, mem[1:])}
            self.assertEqual(len(steps), 1, f"rows {rows} states {states}: {mem}")
            per_token = sh.K * sh.D * rows + 2 * sh.D * 4 + sh.K * sh.DiN * states / sh.C + 4
            self.assertEqual(steps.pop(), 8192 * per_token)

    def test_the_longest_context_fits_and_one_chunk_more_does_not(self):
        sh, hw = roofline.M127B, roofline.A100
        n, T, _ = roofline.longest(sh, hw, 40, 2, 2)
        self.assertEqual(T, 40 * n)
        self.assertEqual(n % sh.C, 0)
        self.assertLessEqual(sum(roofline.worker_memory(sh, n, 2, 2).values()), hw.mem)
        self.assertGreater(sum(roofline.worker_memory(sh, n + sh.C, 2, 2).values()), hw.mem)


class Section(unittest.TestCase):
    BEFORE = "# Benchmarks\n\ntext\n\n<!-- core:begin -->\ncore\n<!-- core:end -->\n\n"
    AFTER = "<!-- traffic:begin -->\n## Traffic\n<!-- traffic:end -->\n\n## Notes\n"

    def write(self, path, body):
        roofline.write_section(body, path)
        return roofline.read(path)

    def test_the_writer_replaces_only_its_own_section(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "BENCHMARKS.md")
            with open(path, "w") as f:
                f.write(self.BEFORE + self.AFTER)
            first = self.write(path, "first body\n")
            self.assertTrue(first.startswith(self.BEFORE))
            self.assertTrue(first.endswith(self.AFTER))
            self.assertLess(first.index(roofline.END), first.index(roofline.ANCHOR))
            self.assertIn("Command: `bench/roofline.py --markdown`", first)
            second = self.write(path, "second body\n")
            self.assertNotIn("first body", second)
            self.assertIn("second body", second)
            self.assertEqual(second.count(roofline.BEGIN), 1)
            outside = re.sub(r"<!-- roofline:begin -->.*<!-- roofline:end -->\n\n", "", second,
                             flags=re.S)
            self.assertEqual(outside, self.BEFORE + self.AFTER)

    def test_the_writer_refuses_a_file_without_its_place(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "BENCHMARKS.md")
            with open(path, "w") as f:
                f.write(self.BEFORE)
            with self.assertRaises(ValueError):
                roofline.write_section("body", path)
            self.assertEqual(roofline.read(path), self.BEFORE)

    def test_the_report_has_every_table(self):
        body = roofline.report()
        for heading in ("Today's PCIe traffic", "Per kernel", "Today's design against",
                        "Against mamba_ssm", "The paper's setting"):
            self.assertIn(heading, body)
        self.assertIsNone(re.search(r"\b(nan|inf)\b", body.lower()))


if __name__ == "__main__":
    unittest.main()
