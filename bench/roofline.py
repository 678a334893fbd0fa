#!/usr/bin/python3
"""A roofline model of one adjsh training step on a GPU (issue 49), counted from the CUDA code.

For each kernel and GEMM of the span schedule (kernels/cuda/device_block.cu, scan_kernels.cuh,
ops_kernels.cuh, lm_head.cu at HEAD's non-resident path), the HBM bytes, f32 flops and
special-function (SFU) operations per token; from them the H100 time per token of a 130M-shaped
Mamba-1 in today's offload design and in the resident one, mamba_ssm's published rate scaled to
that shape, and the paper's 1.27B setting on 40 A100-40GB. A model, not a measurement:
scripts/gpu-check.sh measures the real figures when a GPU is lent.

  bench/roofline.py [--markdown]   (--markdown: also rewrites its section of docs/BENCHMARKS.md)

Letters as docs/MATH.md: T tokens, D width, Di = 2 D, N state, R dt rank, Q = R + 2N, W conv,
K layers, V vocabulary, C chunk, S spans. A chunk call has M own rows and P = M + W - 1 rows
with its conv halo; s is the storage's bytes per value (4 f32, 2 bf16), F = 4 (f32).
"""
import argparse
import collections
import datetime
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "BENCHMARKS.md")
F = 4
GiB = 1 << 30

# hbm B/s, f32 flop/s (no tensor cores: context.cu sets no TF32), SFU op/s (16 per SM per
# clock at the boost clock that gives the f32 peak), dense bf16 tensor flop/s, PCIe B/s, bytes.
Hw = collections.namedtuple("Hw", "name hbm f32 sfu tensor pcie mem")
H100 = Hw("H100 SXM", 3.35e12, 67e12, 132 * 16 * 1.98e9, 989e12, 25e9, 80 * GiB)
A100 = Hw("A100 40GB", 1.555e12, 19.5e12, 108 * 16 * 1.41e9, 312e12, 25e9, 40 * GiB)

# (f32 flops, SFU ops) of the element functions of kernels/cuda/device_math.cuh, built without
# --use_fast_math (CMakeLists.txt): expf is a MUFU.EX2 with range reduction, 1/x an IEEE
# division (MUFU.RCP and a Newton step), log1pf a polynomial. Estimates, stated as such.
EXP, RCP, LOG1P = (8, 1), (8, 1), (20, 1)


def cost(*parts):
    return tuple(sum(p[i] for p in parts) for i in (0, 1))


SIGMOID = cost(EXP, RCP, (1, 0))
SILU = cost(SIGMOID, (1, 0))
SILU_GRAD = cost(SIGMOID, (4, 0))
SOFTPLUS = cost(EXP, LOG1P, (1, 0))
# One (t, i, n) step of the scan kernels, per lane (scan_kernels.cuh): Row::Load recomputes
# Delta = softplus(dtpre + b) in every lane of the channel; a = exp(Delta A); h = a h + Delta x B.
ROW, DECAY, STEP = cost(SOFTPLUS, (1, 0)), cost(EXP, (1, 0)), (4, 0)
FWD_STEP = cost(ROW, DECAY, STEP)
LANE_SUM = (5, 0)  # a product and log2(16) shuffle adds
SEG_FWD = cost(FWD_STEP, (1, 0))                                 # + sum Delta
SEG_REV = cost(ROW, SILU, (1, 0), DECAY, (3, 0))                 # carry = a (ybar C + carry)
SCAN_FWD = cost(FWD_STEP, LANE_SUM, (2, 0))                      # y = h C + D x'
SCAN_FWD_CH = cost(SILU, (1, 0))                                 # o = y silu(z), per channel
BWD_STEP = cost(ROW, DECAY, SILU, (1 + 2 + 2, 0), LANE_SUM, (2, 0), LANE_SUM, LANE_SUM,
                (2 + 2 + 1 + 1 + 2, 0))                          # lambda, y, s_a, s_b, dA, dB, dC
BWD_CH = cost((2, 0), SIGMOID, (1 + 1 + 3 + 2 + 1 + 2, 0), SILU_GRAD)  # ddt, dxc, dD, o, dz
COMBINE = cost(DECAY, (2, 0))                                    # per (segment, i, n)

Op = collections.namedtuple("Op", "phase name bytes flops sfu gemm launches")


class Shape:
    """A Mamba-1 model: common/config.h's fields (R = ceil(D / 16), HF's "auto")."""

    def __init__(self, D, K, V, N=16, W=4, C=256, R=None):
        self.D, self.K, self.V, self.N, self.W, self.C = D, K, V, N, W, C
        self.Di, self.R = 2 * D, R or -(-D // 16)
        self.Q, self.DiN = self.R + 2 * N, 2 * D * N
        L = 1 << (N - 1).bit_length()                  # scan lanes per channel
        self.blocks = -(-self.Di // (256 // L))        # scan_kernels.cuh Blocks
        self.G = sum(self.layer_sizes())               # one layer's parameters

    def layer_sizes(self):
        """device_block.cu Sizes(): norm, in_proj, conv_w, conv_b, x_proj, dt_w, dt_b, A_log,
        Dskip, out_proj."""
        D, Di, W, Q, R, DiN = self.D, self.Di, self.W, self.Q, self.R, self.DiN
        return [D, 2 * Di * D, Di * W, Di, Q * Di, Di * R, Di, DiN, Di, D * Di]

    def params(self):
        return self.K * self.G + self.V * self.D + self.D  # tied head, norm_f


M130, M127B = Shape(768, 24, 50280), Shape(2048, 48, 50280)


def gemm(phase, name, m, n, k, a, b, c, beta=False):
    """C (m, n) = A (m, k) B (k, n) (+ C): each operand through HBM once (a, b, c bytes)."""
    return Op(phase, name, a + b + c * (2 if beta else 1), 2 * m * n * k + (m * n if beta else 0),
              0, True, 1)


def elem(phase, name, nbytes, n, c, launches=1):
    return Op(phase, name, nbytes, n * c[0], n * c[1], False, launches)


def recompute(sh, s, ph, P, M, cpre):
    """device_block.cu Recompute: what every pass rebuilds from u (P, D)."""
    D, Di, Q, R, W = sh.D, sh.Di, sh.Q, sh.R, sh.W
    return [
        elem(ph, "rmsnorm", P * D * (F + s) + D * F + P * F, P * D, (4, 0)),
        gemm(ph, "in_proj (P, 2Di, D)", P, 2 * Di, D, P * D * s, 2 * Di * D * s, P * 2 * Di * s),
        elem(ph, "conv + silu", P * Di * s + Di * (W + 1) * F + M * Di * s * (2 if cpre else 1),
             M * Di, cost((2 * W, 0), SILU)),
        gemm(ph, "x_proj (M, Q, Di)", M, Q, Di, M * Di * s, Q * Di * s, M * Q * s),
        gemm(ph, "dt_proj (M, Di, R)", M, Di, R, M * R * s, Di * R * s, M * Di * s)]


def seg_summary(sh, s, ph, M, adjoint):
    """SegmentSummaryKernel over 64-row segments; with d_o also the reverse pass."""
    Di, DiN, segs = sh.Di, sh.DiN, -(-M // 64)
    rows = M * (2 * Di + 2 * sh.N) * s + (M * Di * (F + s) if adjoint else 0)
    out = segs * (DiN * (2 if adjoint else 1) + Di) * F
    c = cost(SEG_FWD, SEG_REV) if adjoint else SEG_FWD
    return elem(ph, "scan segment summaries", rows + DiN * F + out, M * DiN, c)


def combine(sh, ph, M, seg_in, seg_out, one_in, one_out, adjoint):
    """SegmentCombineKernel: seg_* (segs, Di, N) arrays and one_* (Di, N) ones read and
    written, dtsum (segs, Di) read; a decay per (segment, i, n) each way."""
    segs, DiN = -(-M // 64), sh.DiN
    nbytes = ((seg_in + seg_out) * segs + one_in + one_out) * DiN * F + segs * sh.Di * F
    return elem(ph, "scan segment combine", nbytes, segs * DiN * (2 if adjoint else 1), COMBINE)


def chunk_calls(sh, s, M, resident):
    """{phase: [Op per call]}: one chunk call of each task kind (device_block.cu)."""
    D, Di, Q, R, W, N, DiN, G = sh.D, sh.Di, sh.Q, sh.R, sh.W, sh.N, sh.DiN, sh.G
    P, segs = M + W - 1, -(-M // 64)
    conv_g = lambda p: [elem(p, "convert g to bf16", M * D * (F + s), 0, (0, 0))] if s != F else []
    # Resident summaries fold into the running state on the device (kernels/decay.h DecayAdd).
    fold = lambda p: [elem(p, "fold into the span's state", 4 * DiN * F, DiN, COMBINE)
                      ] if resident else []
    do = lambda p: gemm(p, "dL/do = g W_out (M, Di, D)", M, Di, D, M * D * s, D * Di * s,
                        M * Di * F)
    fs = recompute(sh, s, "fwd_summary", P, M, False) + [
        seg_summary(sh, s, "fwd_summary", M, False),
        combine(sh, "fwd_summary", M, 1, 1, 1, 1, False)] + fold("fwd_summary")
    f = recompute(sh, s, "fwd", P, M, False) + [
        seg_summary(sh, s, "fwd", M, False),
        combine(sh, "fwd", M, 1, 1, 2, 1, False),
        elem("fwd", "scan forward", M * (3 * Di + 2 * N) * s + (segs + 1) * DiN * F
             + M * Di * s, M * DiN, cost(SCAN_FWD, (SCAN_FWD_CH[0] / N, SCAN_FWD_CH[1] / N))),
        elem("fwd", "residual copy", 2 * M * D * F, 0, (0, 0)),
        gemm("fwd", "out_proj (M, D, Di)", M, D, Di, M * Di * s, D * Di * s, M * D * F, True)]
    bs = conv_g("bwd_summary") + recompute(sh, s, "bwd_summary", P, M, False) + [
        do("bwd_summary"), seg_summary(sh, s, "bwd_summary", M, True),
        combine(sh, "bwd_summary", M, 2, 2, 1, 1, True)] + fold("bwd_summary")
    ck, part = -(-M // 16) * DiN * F, sh.blocks * M * 2 * N * F  # checkpoints, dB dC partials
    slices = lambda rows: min(512, max(1, -(-rows // 64)))  # ops_kernels.cuh ReduceSlices
    cw = Di * (W + 1)  # the conv's weight and bias gradients
    b = conv_g("bwd") + recompute(sh, s, "bwd", P, M, True) + [
        do("bwd"), elem("bwd", "memset dxz", P * 2 * Di * s, 0, (0, 0)),
        seg_summary(sh, s, "bwd", M, True),
        combine(sh, "bwd", M, 2, 2, 3, 0, True),
        elem("bwd", "scan backward", M * (3 * Di + 2 * N) * s + M * Di * F
             + 2 * segs * DiN * F + 2 * ck + M * Di * (3 * s + F) + part
             + segs * (DiN + 2 * Di) * F + DiN * F,
             M * DiN, cost(FWD_STEP, FWD_STEP, BWD_STEP, (BWD_CH[0] / N, BWD_CH[1] / N))),
        elem("bwd", "reduce dB dC, segments", part + M * 2 * N * s + segs * (DiN + 2 * Di) * F
             + (2 * DiN + 2 * Di) * F, M * 2 * N * sh.blocks + segs * DiN, (1, 0), 2),
        gemm("bwd", "dW_out = g^T o (D, Di, M)", D, Di, M, M * D * s, M * Di * s, D * Di * F),
        gemm("bwd", "dd = ddt W_dt (M, R, Di)", M, R, Di, M * Di * s, Di * R * s, M * R * s),
        gemm("bwd", "dW_dt (Di, R, M)", Di, R, M, M * Di * s, M * R * s, Di * R * F),
        gemm("bwd", "dW_x (Q, Di, M)", Q, Di, M, M * Q * s, M * Di * s, Q * Di * F),
        gemm("bwd", "dx' += ddbc W_x (M, Di, Q)", M, Di, Q, M * Q * s, Q * Di * s, M * Di * F,
             True),
        elem("bwd", "conv + silu backward", M * Di * (s + 4 * F) + 2 * P * Di * s
             + (2 * slices(M) + 3) * cw * F, M * Di, cost(SILU_GRAD, (2 + 4 * W, 0)), 5),
        gemm("bwd", "dW_in = dxz^T n (2Di, D, P)", 2 * Di, D, P, P * 2 * Di * s, P * D * s,
             2 * Di * D * F),
        gemm("bwd", "dn = dxz W_in (P, D, 2Di)", P, D, 2 * Di, P * 2 * Di * s, 2 * Di * D * s,
             P * D * F),
        elem("bwd", "rmsnorm backward", 5 * P * D * F + (2 * slices(P) + 1) * D * F, P * D,
             (10, 0), 3),
        elem("bwd", "du = g + dn", 3 * M * D * F, M * D, (1, 0)),
        elem("bwd", "gradient sum += the call's (G values)", 3 * G * F, G, (1, 0))]
    return {"fwd_summary": fs, "fwd": f, "bwd_summary": bs, "bwd": b}


def head_call(sh, s, M, resident):
    """lm_head.cu Head over a span's M rows, in nb blocks of 1024 rows and nv of 8192 vocabulary
    entries: pass one the logits and a running log-sum-exp, pass two the logits again, the
    softmax gradient dl and the GEMMs into dnf and dE (V, D)."""
    D, V, ph = sh.D, sh.V, "head"
    nb, nv = -(-M // 1024), -(-V // 8192)
    ops = [elem(ph, "convert E to bf16", V * D * (F + s), 0, (0, 0))
           ] if s != F and not resident else []  # resident: once per step (step_ops)
    logits = lambda name: gemm(ph, name, M, V, D, nv * M * D * s, nb * V * D * s, M * V * F)
    ops += [elem(ph, "memset dE", V * D * F, 0, (0, 0)),
            elem(ph, "rmsnorm", M * D * (F + s) + M * F, M * D, (4, 0), nb),
            logits("logits, pass 1 (M, V, D)"),
            elem(ph, "log-sum-exp", M * V * F, M * V, cost(EXP, (3, 0)), nb * nv),
            logits("logits again, pass 2 (M, V, D)"),
            elem(ph, "softmax gradient dl", M * V * (F + s), M * V, cost(EXP, RCP, (3, 0)),
                 nb * nv),
            gemm(ph, "dnf += dl E (M, D, V)", M, D, V, M * V * s, nb * V * D * s,
                 (2 * nv - 1) * M * D * F),
            gemm(ph, "dE += dl^T nf (V, D, M)", V, D, M, M * V * s, nv * M * D * s,
                 nb * V * D * F, True),
            elem(ph, "rmsnorm backward", 5 * M * D * F, M * D, (10, 0), 3 * nb)]
    if resident:  # the span's (V, D) partial into the fixed tree's sum, on the device
        ops.append(elem(ph, "dE partial into the tree (resident)", 3 * V * D * F, V * D, (1, 0)))
    return [o._replace(launches=nb * nv) if o.gemm else o for o in ops]


def lookup_ops(sh, s, M):
    """A span's embedding lookup: on the host today (engine/span_work.cc); resident, a gather of
    E rows into u^0 and a scatter-add of dL/du^0 into a (V, D) partial, added into the tree."""
    D, V, ph = sh.D, sh.V, "lookup"
    return [elem(ph, "gather u^0 = E[token]", M * D * 2 * F + M * 4, 0, (0, 0)),
            elem(ph, "scatter dE[token] += dL/du^0", M * D * 3 * F + V * D * F, M * D, (1, 0), 2),
            elem(ph, "dE partial into the tree", 3 * V * D * F, V * D, (1, 0))]


def step_ops(sh, s, T, S, resident, share=None):
    """Per-token Ops of one step: the chunk calls times calls per token (the summaries run on
    S - 1 of S spans unless `share` says otherwise), the head and lookup once per span."""
    share = (S - 1) / S if share is None else share
    M, span = sh.C, T / S
    scale = {"fwd_summary": share, "fwd": 1, "bwd_summary": share, "bwd": 1}
    ops = []
    for ph, calls in chunk_calls(sh, s, M, resident).items():
        k = sh.K * scale[ph] / M
        ops += [o._replace(bytes=o.bytes * k, flops=o.flops * k, sfu=o.sfu * k,
                           launches=o.launches * k) for o in calls]
    per_span = head_call(sh, s, span, resident)
    if resident:
        per_span += lookup_ops(sh, s, span)
        if s != F:
            per_span.append(elem("head", "convert E to bf16 (once per step)",
                                 sh.V * sh.D * (F + s) / S, 0, (0, 0), 1 / S))
    return ops + [o._replace(bytes=o.bytes / span, flops=o.flops / span, sfu=o.sfu / span,
                             launches=o.launches / span) for o in per_span]


def op_time(o, hw, tensor=False):
    """max(bytes / HBM, flops / peak, SFU ops / SFU rate), and which bound it."""
    peak = "tensor" if tensor and o.gemm else "f32"
    t = {"HBM": o.bytes / hw.hbm, "SFU": o.sfu / hw.sfu,
         peak: o.flops / (hw.tensor if peak == "tensor" else hw.f32)}
    bound = max(t, key=t.get)
    return t[bound], bound


def block_upload(sh, s):
    """DeviceBlock's weights: 10 pieces on 256-byte boundaries, GEMM weights in storage."""
    gemm_pieces = {1, 4, 5, 9}  # in_proj, x_proj, dt_w, out_proj in layer_sizes order
    return sum(-(-n * (s if i in gemm_pieces else F) // 256) * 256
               for i, n in enumerate(sh.layer_sizes()))


def pcie_today(sh, T, S):
    """(H2D, D2H) bytes of a step's tasks in today's code (HEAD's device_block.cu, lm_head.cu):
    every call moves its rows (staging is f32 whatever the storage); the first chunk of the
    sequence has no halo, the last span's last chunk no mu. The blocks' weight upload at model
    build is outside a task (the measured table's counts) and returned apart."""
    D, Di, DiN, V, C, W = sh.D, sh.Di, sh.DiN, sh.V, sh.C, sh.W
    nC = -(-T // C)
    up = down = 0
    for s_ in range(S):
        c0, c1 = s_ * nC // S, (s_ + 1) * nC // S
        for c in range(c0, c1):
            P = C + (0 if c == 0 else W - 1)
            if s_ < S - 1:  # fwd_summary: u up; h_local, S down
                up, down = up + P * D * F, down + (DiN + Di) * F
            up, down = up + (P * D + DiN) * F, down + (C * D + DiN) * F       # fwd
            if s_ > 0:  # bwd_summary: u, g up; m, S down
                up, down = up + (P * D + C * D) * F, down + (DiN + Di) * F
            last = s_ == S - 1 and c == c1 - 1
            up += (P * D + C * D + DiN + (0 if last else DiN)) * F              # bwd
            down += (P * D + DiN) * F
        up, down = up + sh.G * F, down + sh.G * F  # the task's gradient sum, once each way
    up, down = up * sh.K, down * sh.K
    head_up = S * (V * D + D) * F + T * D * F + T * 8
    head_down = S * (V * D + D) * F + T * (D + 3) * F
    return up + head_up, down + head_down, sh.K * block_upload(sh, F)


def pcie_resident(sh, T, S):
    """(parameter upload, gradient download, the rest) of a resident step: the rest is per
    (layer, span) task its state and Sigma, its conv halo rows each way, and the token ids (16
    bits each where the vocabulary fits: engine/span_work.cc)."""
    D, DiN, W = sh.D, sh.DiN, sh.W
    params = sh.K * block_upload(sh, F) + (sh.V * sh.D + sh.D) * F
    grad = (sh.K * sh.G + sh.V * sh.D + sh.D) * F
    per_layer = (S - 1) * (DiN + sh.Di) + 3 * (S - 1) * DiN + 4 * (S - 1) * (W - 1) * D
    ids = T * (2 if sh.V <= 65536 else 4)
    return params, grad, sh.K * per_layer * F + ids + S * 16


def pcie_today_mamba2(D, K, V, T, S, N=16, P=64, W=4, C=256):
    """(H2D, D2H) of a Mamba-2 step's tasks in today's code (mamba2_block.cu, G = 1 group): the
    forward-only sweep that rebuilds a span's chunk states before its backward included."""
    Di = 2 * D
    H, Cc = Di // P, Di + 2 * N
    SN, halo = H * P * N, (W - 1) * Cc
    grad = D + (2 * Di + 2 * N + H) * D + Cc * W + Cc + 3 * H + Di + D * Di
    nC, up, down = -(-T // C), 0, 0
    for s_ in range(S):
        for c in range(s_ * nC // S, (s_ + 1) * nC // S):
            rows = C + (0 if c == 0 else W - 1)
            up += ((s_ < S - 1) + 2 + (s_ > 0)) * (rows * D + SN)  # summary, fwd, sweep, adjoint
            down += (s_ < S - 1) * (SN + C * H) + C * D + 2 * SN + (s_ > 0) * SN
            up += (s_ > 0) * (C * D + SN) + rows * D + SN + C * D + SN + halo  # bwd's own
            down += C * D + SN + halo
        up, down = up + grad, down + grad
        if s_ > 0:  # HaloBackward
            up, down = up + 2 * (W - 1) * D + halo, down + (W - 1) * D
    head_up = S * (V * D + D) + T * D + T * 2
    head_down = S * (V * D + D) + T * (D + 3)
    return (K * up + head_up) * F, (K * down + head_down) * F


def design(sh, s, T, hw, resident, tensor=False, S=None, share=None):
    """Per-token figures of one design: its ops, PCIe bytes, device and PCIe seconds (today's
    copies never overlap compute; the resident design's PCIe is counted as not overlapped)."""
    S = S or default_spans(T, sh.C)
    ops = step_ops(sh, s, T, S, resident, share)
    pcie = sum(pcie_resident(sh, T, S) if resident else pcie_today(sh, T, S)) / T
    dev = sum(op_time(o, hw, tensor)[0] for o in ops)
    no_sfu = sum(op_time(o._replace(sfu=0), hw, tensor)[0] for o in ops)
    return {"ops": ops, "S": S, "pcie": pcie, "dev": dev, "t": dev + pcie / hw.pcie,
            "dev_no_sfu": no_sfu,
            "bytes": sum(o.bytes for o in ops), "flops": sum(o.flops for o in ops),
            "sfu": sum(o.sfu for o in ops), "gemm_flops": sum(o.flops for o in ops if o.gemm),
            "launches": sum(o.launches for o in ops)}


def default_spans(T, C, per=16384, least=8):
    """engine/span_plan.cc DefaultSpans (every span here is longer than the halo)."""
    return min(-(-T // C), max(least, T // per))


def flops_h(sh, pass_one_share):
    """bench/flops.h GradientFlopsPerToken (exact, nothing kept): (model, executed)."""
    D, Di, R, V, Q, K = sh.D, sh.Di, sh.R, sh.V, sh.Q, sh.K
    recompute = 2 * D * 2 * Di + 2 * Di * Q + 2 * R * Di
    forward = recompute + 2 * Di * D
    head = 3 * 2 * V * D
    pass_one = pass_one_share * (recompute - 2 * D * Di + recompute + 2 * Di * D)
    return K * 3 * forward + head, K * (forward + pass_one + recompute + 2 * forward) + head


# The memory of a resident worker, from the code's layouts (context.h Carver: every buffer on
# 256 bytes; Context::Workspace grows to 9/8 of what a call asks).
def carve(*takes):
    return sum(-(-int(n * size) // 256) * 256 for n, size in takes)


def block_workspace(sh, s, M):
    """The largest of device_block.cu's Forward, Summary and Backward (deferred) layouts."""
    D, Di, Q, N, W, DiN, G = sh.D, sh.Di, sh.Q, sh.N, sh.W, sh.DiN, sh.G
    P, segs = M + W - 1, -(-M // 64)
    slices = lambda rows: min(512, max(1, -(-rows // 64)))
    acts = [(P * D, F), (P * D, s), (P, F), (P * 2 * Di, s), (M * Di, s), (M * Q, s), (M * Di, s)]
    g = [(M * D, F)] + ([(M * D, s)] if s != F else [])
    fwd = carve(*acts, (M * Di, s), (M * D, F), (DiN, F), (DiN, F), (segs * Di * (2 * N + 1), F))
    summ = carve(*acts, *g, (M * Di, F), (DiN, F), (Di, F), (segs * Di * (4 * N + 1), F))
    scratch = segs * (5 * DiN + 3 * Di) + -(-M // 16) * DiN + sh.blocks * M * 2 * N
    bwd = carve(*acts, (M * Di, s), *g, (M * Di, F), (M * Di, s), (P * 2 * Di, s), (M * Di, s),
                (M * Di, F), (M * Q, s), (P * D, F), (DiN, F), (DiN, F), (DiN, F), (G, F),
                (scratch, F), (max((slices(M) + 1) * Di * (W + 1), slices(P) * D), F))
    return max(fwd, summ, bwd) * 9 // 8


def head_layout(sh, s, M):
    """lm_head.cu Head's layout: E (and its bf16 copy), dE and one block's buffers."""
    D, V, R, Vb = sh.D, sh.V, min(1024, M), min(8192, sh.V)
    return carve((V * D, F), *([(V * D, s)] if s != F else []), (D, F), (R * D, F), (R * D, s),
                 (R, F), (R, 8), (R * Vb, F), (R * Vb, s), (R, F), (R, F), (R, F), (R * D, F),
                 (V * D, F), (D, F), (D, F), (min(512, -(-R // 64)) * D, F))


def worker_memory(sh, n, rows, states, s=2):
    """{item: bytes} a resident worker holds for n tokens of its spans (one span: n rows):
    rows and states in `rows` / `states` bytes per value, GEMM weights in storage `s`."""
    D, K = sh.D, sh.K
    return {
        "CUDA context and allocator (assumed)": GiB // 2,
        "cuBLAS workspace (context.cu)": 32 << 20,
        "layer weights (DeviceBlock layout)": K * block_upload(sh, s),
        "gradient sums, every layer (f32)": K * sh.G * F,
        "head: E, bf16 E, dE, a block (lm_head.cu)": head_layout(sh, s, n),
        "lookup partial dE (f32)": sh.V * D * F,
        "block workspace (device_block.cu)": block_workspace(sh, s, sh.C),
        "layer inputs (K, n + W - 1, D)": K * (n + sh.W - 1) * D * rows,
        "dL/du and the spare (2, n, D) f32": 2 * n * D * F,
        "chunk-boundary states (K, n / C, Di, N)": K * -(-n // sh.C) * sh.DiN * states,
        "token ids (n) u32": 4 * n}


def longest(sh, hw, workers, rows, states):
    """The most tokens per worker (whole chunks) whose memory fits hw.mem, and their total."""
    mem = lambda n: sum(worker_memory(sh, n, rows, states).values())
    slope = (mem(8192) - mem(4096)) / 4096  # past the head's 1024-row blocks: linear
    n = int((hw.mem - mem(4096)) / slope + 4096) // sh.C * sh.C
    while mem(n + sh.C) <= hw.mem:
        n += sh.C
    while n > 0 and mem(n) > hw.mem:
        n -= sh.C
    return n, n * workers, slope


def step_time(sh, T, workers, hw, tensor=False, round_trip=1e-3):
    """A step of T tokens on `workers` resident workers, one span each: the slowest (a middle
    span runs both summaries) computes T / workers tokens, then its parameter upload and
    gradient download over PCIe, and 4 K coordinator round trips (summaries and combines)."""
    n = T // workers
    d = design(sh, 2, T, hw, True, tensor, S=workers, share=1)
    params, grad, rest = pcie_resident(sh, T, workers)
    pcie = (params + grad + rest / workers) / hw.pcie
    return n * d["dev"] + pcie + 4 * sh.K * round_trip, n * d["dev"], pcie


# The report.
BEGIN, END, ANCHOR = "<!-- roofline:begin -->", "<!-- roofline:end -->", "<!-- traffic:begin -->"
FLA_RATE = 18000  # FLA's Mamba ~1.4B on one H100 at 16K-32K, tokens/s (as issue 49 quotes it)


def read(path):
    with open(path) as f:
        return f.read()


def fmt(x, digits=0):
    return f"{x:,.{digits}f}"


def assumptions():
    return [
        "Kernels: each launch reads each operand array from HBM once and writes each result "
        "once (re-reads inside a kernel hit L1/L2; nothing is assumed to stay in L2 between "
        "launches, though one chunk's buffers would fit H100's 50 MB L2: an upper bound on "
        "HBM bytes). GEMMs read A and B and write C once (C read too when beta = 1).",
        "Time per kernel = max(bytes / HBM, f32 flops / f32 peak, SFU ops / SFU rate): the SFU "
        "(16 per SM per clock: expf, 1/x, log1pf are one each, with 8, 8 and 20 f32 flops "
        "around them, built without --use_fast_math) is a third roof, since the scan computes "
        "softplus and exp per (channel, state) lane. Summed over kernels; launch gaps, "
        "occupancy and cuBLAS efficiency are not modelled (every GEMM at peak).",
        "f32 GEMMs run on the f32 pipes (context.cu: no TF32). With bf16 storage every GEMM "
        "takes bf16 A and B with f32 sums (CUBLAS_COMPUTE_32F), which cuBLAS may run on tensor "
        "cores: the 'tensor' rows take the dense bf16 peak for GEMMs (unverified until a GPU "
        "run).",
        "Every chunk holds C = 256 own rows and W - 1 = 3 halo rows; the summaries run on "
        "S - 1 of the S default spans (engine/span_plan.cc); the head and the lookup once per "
        "span.",
        "Today: every call's copies through pinned staging at the PCIe rate, never overlapping "
        "compute (device_block.cu, lm_head.cu at HEAD); the blocks' weights uploaded once per "
        "step; the lookup and the host adds on the host (not timed).",
        "Resident: the same kernels read and write the span's rows, states and adjoints in "
        "place; E and its bf16 copy stay on the device; each span's (V, D) partials of the "
        "head and the lookup are added into the tree's sum on the device; PCIe carries one "
        "parameter upload, one gradient download, per (layer, span) task its state (Di N) and "
        "Sigma, its conv halo rows (W - 1, D) each way, and the token ids (2 B each where the "
        "vocabulary fits 16 bits); counted "
        "as not overlapping compute.",
    ]


# Today's offload design as bench/traffic_benchmarks.py counted it on the emulated device
# (docs/BENCHMARKS.md "Host-device traffic of a GPU step", code 69444d8; D = 256, K = 4,
# V = 50,280): model, T, spans, H2D and D2H bytes per token. Kept here because that table will
# hold the resident design's counts once it is measured.
MEASURED_TODAY = [("Mamba-1", 65536, 8, 32926, 18392), ("Mamba-1", 262144, 16, 30132, 14890),
                  ("Mamba-2", 65536, 8, 38975, 18955), ("Mamba-2", 262144, 16, 36303, 15487)]


def cross_check():
    """Today's PCIe model against MEASURED_TODAY: rows of (model, T, S, measured H2D, D2H,
    modelled H2D, D2H), bytes per token."""
    rows = []
    for model, T, S, up_m, down_m in MEASURED_TODAY:
        if model == "Mamba-1":
            up, down, _ = pcie_today(Shape(256, 4, 50280), T, S)
        else:
            up, down = pcie_today_mamba2(256, 4, 50280, T, S)
        rows.append((model, T, S, up_m, down_m, up / T, down / T))
    return rows


def kernel_table(T=65536):
    d4, d2 = design(M130, F, T, H100, True), design(M130, 2, T, H100, True)
    bf16 = {(o.phase, o.name): o.bytes for o in d2["ops"]}
    lines = ["| pass | kernel or GEMM | HBM B/token f32 | bf16 storage | flops/token | "
             "SFU ops/token | flops/B | bound | time share |", "|---" * 9 + "|"]
    for o in d4["ops"] + [o for o in d2["ops"] if o.name.startswith("convert")]:
        t, bound = op_time(o, H100)
        f32 = (o.phase, o.name) in {(p.phase, p.name) for p in d4["ops"]}
        lines.append(f"| {o.phase} | {o.name} | {fmt(o.bytes) if f32 else '-'} | "
                     f"{fmt(bf16.get((o.phase, o.name), 0))} | {fmt(o.flops)} | {fmt(o.sfu)} | "
                     f"{o.flops / max(o.bytes, 1):.1f} | {bound if f32 else '-'} | "
                     f"{100 * t / d4['dev'] if f32 else 0:.1f}% |")
    return lines, d4


DESIGNS = [("today", F, False, False), ("today", 2, False, False), ("resident", F, True, False),
           ("resident", 2, True, False), ("resident, bf16 GEMMs on tensor cores", 2, True, True)]


def design_table(Ts=(65536, 1 << 20)):
    lines = ["| T | design | storage | PCIe B/token | HBM B/token | GFLOP/token | SFU Mop/token | "
             "device us/token | PCIe us/token | us/token | tokens/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    out = {}
    for T in Ts:
        for name, s, res, tensor in DESIGNS:
            d = design(M130, s, T, H100, res, tensor)
            out[(T, name, s)] = d
            lines.append(f"| {T // 1024}K (S = {d['S']}) | {name} | {'f32' if s == F else 'bf16'} "
                         f"| {fmt(d['pcie'])} | {fmt(d['bytes'])} | {d['flops'] / 1e9:.3f} | "
                         f"{d['sfu'] / 1e6:.2f} | {d['dev'] * 1e6:.1f} | "
                         f"{d['pcie'] / H100.pcie * 1e6:.1f} | {d['t'] * 1e6:.1f} | "
                         f"{fmt(1 / d['t'])} |")
    return lines, out


def report():
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    L = [f"Computed {when} UTC from the code at {commit}. **A model, not a measurement**: "
         "`scripts/gpu-check.sh` measures the real figures when a GPU is lent. Shapes: 130M "
         f"Mamba-1 D = {M130.D}, K = {M130.K}, V = {M130.V}, N = 16, Di = {M130.Di}, "
         f"R = {M130.R}, W = 4, chunk 256 ({fmt(M130.params())} parameters); H100 "
         "3.35 TB/s, 67 TFLOP/s f32, 4.18 T SFU op/s, 25 GB/s PCIe.", "", "Assumptions:", ""]
    L += [f"- {a}" for a in assumptions()]
    L += ["", "### Today's PCIe traffic, modelled against the measured counts", "",
          "The per-call copies of device_block.cu, mamba2_block.cu and lm_head.cu, summed over "
          "the step's tasks, against the counts of the emulated device at 69444d8 (D = 256, "
          "K = 4, V = 50,280):", "",
          "| model | T | spans | H2D B/token measured | model | D2H B/token measured | model |",
          "|---|---|---|---|---|---|---|"]
    for model, T, S, um, dm, u, d in cross_check():
        L.append(f"| {model} | {T // 1024}K | {S} | {fmt(um)} | {fmt(u)} | {fmt(dm)} | {fmt(d)} |")
    kt, d64 = kernel_table()
    L += ["", "### Per kernel: 130M Mamba-1, T = 64K, resident, f32 (H100)", "",
          "Per token of the step (every layer; the summaries' share 7/8, the head and lookup "
          "per span); 'time share' of the device time at f32:", ""] + kt
    dt, ds = design_table()
    gemm = sum(op_time(o, H100)[0] for o in d64["ops"] if o.gemm) / d64["dev"]
    sfu = sum(op_time(o, H100)[0] for o in d64["ops"] if op_time(o, H100)[1] == "SFU")
    acc = [o for o in d64["ops"] if o.name.startswith("gradient sum")][0]
    L += ["", f"GEMMs take {100 * gemm:.0f}% of the device time, the SFU-bound scan kernels "
          f"{100 * sfu / d64['dev']:.0f}% (without the SFU roof the device time would be "
          f"{d64['dev_no_sfu'] * 1e6:.1f} us/token, not {d64['dev'] * 1e6:.1f}); adding each "
          f"chunk call's whole layer gradient into the task's sum (G = {fmt(M130.G)} values, "
          f"3 G floats of HBM per call) is {100 * op_time(acc, H100)[0] / d64['dev']:.1f}%. "
          "Kernel launches per chunk call (" + ", ".join(
              f"{ph} {sum(o.launches for o in ops):.0f}" for ph, ops in
              chunk_calls(M130, F, M130.C, True).items()) + f"; {d64['launches']:.1f} per "
          f"token) are not in the times: at 1 us of idle GPU each they would add "
          f"{d64['launches']:.1f} us/token (one CUDA graph per task would remove most).",
          "", "### Today's design against the resident one (130M, H100)", ""] + dt
    r64, r1m = ds[(65536, "resident", F)], ds[(1 << 20, "resident", F)]
    t64, t1m = ds[(65536, "today", F)], ds[(1 << 20, "today", F)]
    tc = ds[(1 << 20, "resident, bf16 GEMMs on tensor cores", 2)]
    L += ["", f"Today each token moves {fmt(t64['pcie'])} B over PCIe at 64K "
          f"({fmt(t1m['pcie'])} at "
          f"1M): {100 * (t64['pcie'] / H100.pcie) / t64['t']:.0f}% of the step. Resident, the "
          f"PCIe bytes per token beyond the parameters and the gradient are "
          f"{fmt(pcie_resident(M130, 65536, 8)[2] / 65536)} at 64K and "
          f"{fmt(pcie_resident(M130, 1 << 20, 64)[2] / (1 << 20))} at 1M (per (layer, span) task "
          "its Di N state, K (S - 1) (4 Di N + Di + 4 (W - 1) D) floats a step, and 4 B of token "
          "id per token); at the issue's shape (D = 256, K = 4) "
          f"{fmt(pcie_resident(Shape(256, 4, 50280), 65536, 8)[2] / 65536)} at 64K and "
          f"{fmt(pcie_resident(Shape(256, 4, 50280), 1 << 20, 64)[2] / (1 << 20))} at 1M, "
          "against the issue's goal of 64.", "",
          "Mamba-2 (mamba2_block.cu) has the PCIe model above only: its scan "
          "(mamba2_kernels.cuh) runs one block per head, serially over a chunk's rows with the "
          "state in global memory, which latency bounds rather than bytes or flops."]
    big, small = flops_h(M127B, 0)[0], flops_h(M130, 0)[0]
    ssm = FLA_RATE * big / small
    L += ["", "### Against mamba_ssm", "",
          f"FLA's Mamba ~1.4B (D = 2048, K = 48) trains at about {fmt(FLA_RATE)} tokens/s on one "
          "H100 at 16K-32K (the figure issue 49 quotes). Scaled by bench/flops.h's model flops "
          f"per token ({big / 1e9:.2f} GFLOP at 1.4B, {small / 1e9:.3f} at 130M: x"
          f"{big / small:.2f}), that is about {fmt(ssm)} tokens/s at 130M, assuming the same "
          "flop rate (bf16 tensor cores; a smaller model reaches a lower rate, so this is "
          f"mamba_ssm's upper bound). The model predicts adjsh resident at {fmt(1 / r64['t'])} "
          f"tokens/s (64K) and {fmt(1 / r1m['t'])} (1M) in f32: {1 / r1m['t'] / ssm:.2f}x; "
          "with bf16 "
          f"GEMMs on tensor cores {fmt(1 / tc['t'])} ({1 / tc['t'] / ssm:.2f}x), where the scans' "
          "SFU work and the HBM traffic bound it. mamba_ssm's figure is at 16K-32K, where "
          "backpropagation's activations fit; adjsh's predicted rate is flat from 64K to 1M."]
    L += ["", "### The paper's setting: 1.27B Mamba on 5 P4 instances (40 A100 40 GB)", "",
          f"D = {M127B.D}, K = {M127B.K}, R = {M127B.R}, V = {M127B.V}: {fmt(M127B.K * M127B.G)} "
          f"parameters in the layers, {fmt(M127B.params())} with the embedding. Each worker one "
          "span of T / 40 tokens, resident; AdamW on the coordinator. Bytes per worker at the "
          "longest context of each storage choice (rows: the layer inputs; the third column "
          "keeps rows and states in the compute type); GEMM weights in bf16 as DeviceBlock "
          "converts them for bf16 storage, the gradient sums of every layer kept to the step's "
          "end:", ""]
    variants = [("rows bf16, states bf16", 2, 2), ("rows bf16, states f32", 2, F),
                ("rows f32, states f32", F, F)]
    fits = [longest(M127B, A100, 40, r, st) for _, r, st in variants]
    L += ["| item | " + " | ".join(v[0] for v in variants) + " |",
          "|---|" + "---|" * len(variants)]
    mems = [worker_memory(M127B, f[0], v[1], v[2]) for f, v in zip(fits, variants)]
    for item in mems[0]:
        L.append(f"| {item} | " + " | ".join(f"{m[item] / GiB:.2f} GiB" for m in mems) + " |")
    L.append("| **total** | " + " | ".join(f"{sum(m.values()) / GiB:.2f} GiB" for m in mems)
             + " |")
    L.append("| bytes per token of a worker | " + " | ".join(fmt(f[2]) for f in fits) + " |")
    L.append("| **longest context (40 workers)** | " + " | ".join(
        f"**{fmt(f[1])}** ({fmt(f[0])} per worker)" for f in fits) + " |")
    L += ["", "Predicted step time (A100: 1.555 TB/s, 19.5 TFLOP/s f32, 312 dense bf16, 25 GB/s "
          "PCIe; "
          "the slowest worker, a middle span, runs both summaries; plus its parameter upload "
          "and gradient download over PCIe and 4 K coordinator round trips of 1 ms; the "
          "parameters' and partials' way between workers not modelled), against the paper's "
          "35K (backpropagation) and 100K+ (adjoint sharding) trainable contexts:", "",
          "| T | tokens per worker | compute s (f32) | PCIe s | step s (f32) | "
          "step s (bf16 GEMMs on tensor cores) |", "|---|---|---|---|---|---|"]
    for T in (35 * 1024, 100 * 1024, fits[0][1]):
        a, b = step_time(M127B, T, 40, A100), step_time(M127B, T, 40, A100, True)
        L.append(f"| {fmt(T)} | {fmt(T // 40)} | {a[1]:.2f} | {a[2]:.2f} | {a[0]:.2f} | "
                 f"{b[0]:.2f} |")
    return "\n".join(L) + "\n"


def write_section(body, path=DOC):
    """body into `path` between the roofline markers (created just before the traffic
    section's); nothing else in the file changes."""
    text = read(path)
    block = (f"{BEGIN}\n## GPU roofline model (issue 49)\n\nCommand: `bench/roofline.py "
             f"--markdown`\n\n{body.rstrip()}\n{END}")
    if BEGIN in text and END in text:
        i, j = text.index(BEGIN), text.index(END) + len(END)
        text = text[:i] + block + text[j:]
    elif ANCHOR in text:
        i = text.index(ANCHOR)
        text = text[:i] + block + "\n\n" + text[i:]
    else:
        raise ValueError(f"{path}: neither the roofline markers nor {ANCHOR}")
    with open(path, "w") as f:
        f.write(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", action="store_true",
                    help="also write the section into docs/BENCHMARKS.md")
    a = ap.parse_args(argv)
    body = report()
    print(body)
    if a.markdown:
        write_section(body)
        print(f"roofline: section written to {os.path.relpath(DOC, ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
