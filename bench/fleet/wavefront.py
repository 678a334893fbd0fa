# The wavefront model (synth only): the retired chunk schedule, the coordinator's serial forward
# and LM head at one worker's speed, then backward tasks (k, c), each needing (k+1, c) and
# (k, c+1) (at most K at once), handed to any idle worker with their tensors and, once per
# worker, the layer's parameters.

from .cost import layer_flops
from .plan import FWD, BWD
from .shape import F32
from .sim import SimTask


def wavefront_tasks(shape, plan, cost, speed, partials):
    """The retired schedule: the coordinator's serial forward + head (returned as the release
    time of every task), then (k, c) backward tasks, top layer first, last chunk first; each
    needs (k+1, c) and (k, c+1)."""
    K, nC, D, DiN = shape.K, plan.nC, shape.D, shape.Di * shape.N
    chunks = plan.chunks  # (t0, len, halo): SpanPlan::Chunk(c)
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
