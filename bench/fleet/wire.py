# The byte model: what each task fetches and returns on the wire (engine/span_tensors.h: the
# span's tokens with its first task, halo rows, h0 / mu, summaries, the parameter partials), and
# for the worker tree the reduction groups whose sums travel among the workers
# (engine/reduce_groups.h) and the pieces the parameter copy is relayed in.

from .plan import FWD_SUMMARY, FWD, BWD_SUMMARY, BWD
from .shape import F32


TIMING_BYTES = 64         # in every result: "compute_seconds", "rebuild_seconds" F64 each and
                          # "device_traffic" I64 (6) (engine/span_tensors.h)
DEVICE_TRAFFIC_BYTES = 48  # the last of those, which older traces' results did not carry
HEAD_SCALAR_BYTES = 16    # "loss_sum" F64 and "correct" I64 with fwd(K-1, s)
HEAD = "head"             # reduction groups beside layer k's (engine/reduce_groups.h): the LM
LOOKUP = "lookup"         # head's (V, D) partial, the embedding lookups' (V, D) and norm_f's (D)
NORM_F = "norm_f"
TIED = "head+lookup"      # the tied model's head and lookup roots, added by worker 0 and sent
                          # to the coordinator as one (engine/reduce_groups.h TiedEmbedGroup)
PARAM_PIECE_BYTES = 1 << 20  # tensors travel in 1 MiB pieces; a tree worker relays each piece


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
    """{group: bytes} of the parameter partials in a task's result, by reduction group: layer
    k's gradient with bwd(k, s), plus the embedding lookups' (V, D) (LOOKUP) with bwd(0, s); the
    LM head's (V, D) (HEAD) and norm_f's (D) (NORM_F) with fwd(K-1, s). The star carries them
    in the result; the tree adds each as a leaf of its group's tree."""
    phase, k, s = task
    out = {}
    if phase == BWD:
        out[k] = F32 * shape.layer_params()
        if k == 0:
            out[LOOKUP] = F32 * shape.embed_params()
    elif phase == FWD and k + 1 == shape.K:
        out[HEAD] = F32 * shape.embed_params()
        out[NORM_F] = F32 * shape.D
    return out


def output_bytes(shape, plan, task):
    """Every byte of a task's result (OutputSlots + the scalars), partials included, as the
    star sends it; with the worker tree the result is this less partial_bytes."""
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


def tree_groups(shape):
    """The K + 3 reduction groups of the worker tree and the bytes of one node's value (f32,
    engine/reduce_groups.h GroupBytes): layer 0..K-1, HEAD, LOOKUP, NORM_F, in group order."""
    g = {k: F32 * shape.layer_params() for k in range(shape.K)}
    g[HEAD] = F32 * shape.embed_params()
    g[LOOKUP] = F32 * shape.embed_params()
    g[NORM_F] = F32 * shape.D
    return g
