# The cost model: FLOPs per token of each phase from the shape (GEMMs 2 m n k, a scan pass
# 8 Di N), and seconds per token per FLOP of each phase (and of the LM head) fitted on a real
# trace, which give a synthesized task its compute time.

from collections import defaultdict

from .errors import FleetError
from .plan import PHASES, FWD_SUMMARY, FWD, BWD_SUMMARY, BWD


SCAN_FLOPS = 8            # per (channel, state) per token, per scan pass


def layer_flops(shape):
    """FLOPs per token of one layer's tasks by phase (see bench/fleet_sim.py's docstring), and of the head."""
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
