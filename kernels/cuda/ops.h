// The CUDA block's non-scan kernels, launched on a stream: RMSNorm, the causal depthwise conv
// with its halo, storage conversion, and the blocked cross-entropy. Every reduction runs in a
// fixed order (no atomics), so results are bitwise the same from run to run. S is the storage
// type (float or bf16); sums are f32. Letters as in kernels/cpu/mamba_block.h.
#ifndef ADJSH_KERNELS_CUDA_OPS_H_
#define ADJSH_KERNELS_CUDA_OPS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace adjsh::cuda {

// n (rows, D) = u r w with r (rows) = 1 / sqrt(mean(u^2) + eps).
template <typename S>
void RmsNormForward(cudaStream_t s, const float* u, int64_t rows, int64_t D, const float* w,
                    float eps, S* n, float* r);

// Given dn (rows, D): du (rows, D) = r v - u r^3 (v . u) / D with v = dn . w (du may alias dn);
// dw (D) = sum over rows of dn . u r, written, in two fixed-order stages (partial sums over
// contiguous slices of rows, then the slices in order) through scratch:
// RmsNormBackwardScratch(rows, D) floats.
void RmsNormBackward(cudaStream_t s, const float* u, int64_t rows, int64_t D, const float* w,
                     const float* r, const float* dn, float* dw, float* du, float* scratch);
int64_t RmsNormBackwardScratch(int64_t rows, int64_t D);

// The causal conv over rows p = halo + t of x = xz[:, :Di] (row stride 2 Di), t in [0, M):
// cpre[t] = b + sum_j w[:, j] x[halo + t - W + 1 + j] (rows before 0 are zero), xc = silu(cpre).
// cpre may be null (the forward does not keep it). w is (Di, W).
template <typename S>
void ConvSiluForward(cudaStream_t s, const S* xz, int64_t halo, int64_t M, int64_t Di, int64_t W,
                     const float* w, const float* b, S* cpre, S* xc);

// Backward of ConvSiluForward over the chunk's len rows: dxc (len, Di) = dL/dxc on entry,
// dL/dcpre on exit; the x columns of dxz (halo + len rows, row stride 2 Di) are written with
// dL/dx (halo rows included); dw (Di, W) and db (Di) written, reduced over the rows as
// RmsNormBackward's dw through scratch: ConvSiluBackwardScratch(len, Di, W) floats.
template <typename S>
void ConvSiluBackward(cudaStream_t s, const S* xz, const S* cpre, int64_t halo, int64_t len,
                      int64_t Di, int64_t W, const float* w, float* dxc, S* dxz, float* dw,
                      float* db, float* scratch);
int64_t ConvSiluBackwardScratch(int64_t len, int64_t Di, int64_t W);

template <typename S>
void Convert(cudaStream_t s, const float* in, int64_t n, S* out);

// out[k] = a[k] + b[k] (f32).
void Add(cudaStream_t s, const float* a, const float* b, int64_t n, float* out);
// dst = src (n floats, not overlapping) and dst = 0 as kernels: either side may be span rows in
// mapped host memory past the device budget (kernels/cuda/device_row_space.h DeviceRowSpace), which
// kernels reach in stream order, where a cudaMemcpyAsync or cudaMemsetAsync on them would be a
// host-to-host operation outside the stream's order.
void CopyFloats(cudaStream_t s, const float* src, int64_t n, float* dst);
void ZeroFloats(cudaStream_t s, int64_t n, float* dst);
// flag[0] = 1 where any of src[0, n) is NaN or infinite (every such thread stores the same 1:
// no atomics, the same result in any order); otherwise flag is left as it was.
void MarkNonFinite(cudaStream_t s, const float* src, int64_t n, float* flag);
// ids[i] = packed[i] for i < n (token ids widened from 16 bits; not overlapping).
void WidenIds(cudaStream_t s, const uint16_t* packed, int64_t n, uint32_t* ids);

// v (Di, N) = exp(A S) v + add per (i, n), with S (Di) a chunk's delta sums (kernels/decay.h
// DecayAdd); sigma (Di) += S when non-null. v may not alias add.
void DecayFold(cudaStream_t s, const float* A, const float* S, const float* add, int64_t Di,
               int64_t N, float* v, float* sigma);

// rows (n, D) = table[ids]: the embedding lookup of n tokens.
void GatherRows(cudaStream_t s, const float* table, const uint32_t* ids, int64_t n, int64_t D,
                float* rows);
// table[ids[t]] += rows[t] for t = 0..n-1, each entry's sum in token order (the lookup's
// backward; no atomics).
void ScatterAddRows(cudaStream_t s, const float* rows, const uint32_t* ids, int64_t n, int64_t D,
                    float* table);

// targets[t] = next_ids[t] for t < valid, -1 (no target) for valid <= t < n: a resident span's
// targets from its token ids on the device (the next token of each row).
void NextTargets(cudaStream_t s, const uint32_t* next_ids, int64_t valid, int64_t n,
                 int64_t* targets);

// One vocabulary block [v0, v0 + Vb) of the cross-entropy over M rows, logits (M, Vb) f32.
// Running log-sum-exp state per row: mx (running max) and sum (of exp(logit - mx)); first = the
// first block (state initialised). tlogit[row] = the target's logit when the target is in the
// block. Rows with a negative target are skipped by CeGrad.
void CeStats(cudaStream_t s, const float* logits, int64_t M, int64_t Vb, int64_t v0,
             const int64_t* targets, bool first, float* mx, float* sum, float* tlogit);

// *loss += log(sum) - (tlogit - mx) over the M rows with a target, in row order, in double:
// the loss of a block of rows from CeStats's state, summed where it is.
void CeLossAdd(cudaStream_t s, const float* mx, const float* sum, const float* tlogit,
               const int64_t* targets, int64_t M, double* loss);

// dlogits (M, Vb) = scale (softmax - onehot(target)), 0 for rows with a negative target.
template <typename S>
void CeGrad(cudaStream_t s, const float* logits, int64_t M, int64_t Vb, int64_t v0,
            const int64_t* targets, const float* mx, const float* sum, float scale, S* dlogits);

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_OPS_H_
