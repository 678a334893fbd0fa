// The kernels of ops.h and their launches, as a header: ops.cu compiles them for the GPU;
// tests/cuda/ops_emulation_test.cc compiles the same code for the host (host_emulation.h).
// A launch goes through ADJSH_LAUNCH(kernel, grid, block, stream, args...), which the includer
// defines.
#ifndef ADJSH_KERNELS_CUDA_OPS_KERNELS_CUH_
#define ADJSH_KERNELS_CUDA_OPS_KERNELS_CUH_

#include <cstdint>

#include "kernels/cuda/device_math.cuh"

namespace adjsh::cuda::ops_internal {


constexpr int kThreads = 256;

template <typename S>
__global__ void RmsNormForwardKernel(const float* u, int64_t D, const float* w, float eps, S* n,
                                     float* r) {
  __shared__ float shared[kThreads];
  const int64_t row = blockIdx.x;
  const float* ut = u + row * D;
  float ss = 0;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) ss += ut[d] * ut[d];
  ss = BlockSum(ss, shared);
  const float rt = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  if (threadIdx.x == 0) r[row] = rt;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) Store(n + row * D + d, ut[d] * rt * w[d]);
}

__global__ void RmsNormBackwardRowsKernel(const float* u, int64_t D, const float* w,
                                          const float* r, const float* dn, float* du) {
  __shared__ float shared[kThreads];
  const int64_t row = blockIdx.x;
  const float* ut = u + row * D;
  const float* gt = dn + row * D;
  float dot = 0;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dot += gt[d] * w[d] * ut[d];
  dot = BlockSum(dot, shared);
  const float rt = r[row];
  const float coef = rt * rt * rt * dot / static_cast<float>(D);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
    du[row * D + d] = rt * gt[d] * w[d] - ut[d] * coef;
}

// The weight gradients (RMSNorm's dw, the conv's dw and db) are sums over rows, reduced in two
// stages in a fixed order, so that the result depends only on the shape (bitwise run to run, no
// atomics) and the work spreads over the GPU:
//   stage 1: the rows are cut into `slices` contiguous ranges (ReduceSlices: a function of the
//            row count alone); block (x, y) sums slice y for kReduceCols columns, its
//            kReduceLanes lanes of 32 threads each a contiguous part of the slice, the lanes then
//            added in lane order; the slice's sum goes to partial[y][column].
//   stage 2: one thread per column adds the slices' partials in slice order.
constexpr int kReduceCols = 32;                     // one warp: coalesced row reads
constexpr int kReduceLanes = kThreads / kReduceCols;  // 8
constexpr int64_t kReduceMinRows = 64;              // rows per slice at least (but one slice)
constexpr int64_t kReduceMaxSlices = 512;

inline int64_t ReduceSlices(int64_t rows) {
  const int64_t slices = (rows + kReduceMinRows - 1) / kReduceMinRows;
  return slices < 1 ? 1 : slices > kReduceMaxSlices ? kReduceMaxSlices : slices;
}
// Slice y of `slices` over [0, rows): [begin, end).
__device__ __forceinline__ void SliceRange(int64_t rows, int64_t slices, int64_t y, int64_t* begin,
                                           int64_t* end) {
  const int64_t per = (rows + slices - 1) / slices;
  *begin = y * per < rows ? y * per : rows;
  *end = *begin + per < rows ? *begin + per : rows;
}
// The lane's part [begin, end) of [b, e).
__device__ __forceinline__ void LaneRange(int64_t b, int64_t e, int lane, int64_t* begin,
                                          int64_t* end) {
  const int64_t per = (e - b + kReduceLanes - 1) / kReduceLanes;
  *begin = b + lane * per < e ? b + lane * per : e;
  *end = *begin + per < e ? *begin + per : e;
}
// Stage 1's cell of this thread: its column, blockIdx.x * kReduceCols + its place in the warp,
// and its lane's rows [lb, le) of slice blockIdx.y of [0, rows).
struct ReduceCell {
  int64_t col, lb, le;
};
__device__ __forceinline__ ReduceCell ThisReduceCell(int64_t rows, int64_t slices) {
  ReduceCell c;
  c.col = int64_t{blockIdx.x} * kReduceCols + threadIdx.x % kReduceCols;
  int64_t b, e;
  SliceRange(rows, slices, blockIdx.y, &b, &e);
  LaneRange(b, e, static_cast<int>(threadIdx.x / kReduceCols), &c.lb, &c.le);
  return c;
}
// The lanes' sums (one per thread, in `shared`) added in lane order for the block's columns;
// the result is valid in the threads of lane 0.
__device__ __forceinline__ float LaneSum(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  float total = 0;
  if (threadIdx.x < kReduceCols) {
    for (int l = 0; l < kReduceLanes; ++l) total += shared[l * kReduceCols + threadIdx.x];
  }
  __syncthreads();
  return total;
}

// Stage 1 of dw[d] = sum_rows dn[row, d] u[row, d] r[row]: partial (slices, D).
__global__ void RmsNormWeightGradPartialKernel(const float* u, int64_t rows, int64_t D,
                                               const float* r, const float* dn, int64_t slices,
                                               float* partial) {
  __shared__ float shared[kThreads];
  const ReduceCell cell = ThisReduceCell(rows, slices);
  const int64_t d = cell.col;
  float acc = 0;
  if (d < D) {
    for (int64_t t = cell.lb; t < cell.le; ++t) acc += dn[t * D + d] * u[t * D + d] * r[t];
  }
  acc = LaneSum(acc, shared);
  if (threadIdx.x < kReduceCols && d < D) partial[int64_t{blockIdx.y} * D + d] = acc;
}

// Stage 2 of every weight gradient: out[k] = sum_y partial[y][k] in order, k in [0, n).
__global__ void SumSlicesKernel(const float* partial, int64_t slices, int64_t n, float* out) {
  ADJSH_GRID_LOOP(k, n) {
    float acc = 0;
    for (int64_t y = 0; y < slices; ++y) acc += partial[y * n + k];
    out[k] = acc;
  }
}

template <typename S>
__global__ void ConvForwardKernel(const S* xz, int64_t halo, int64_t M, int64_t Di, int64_t W,
                                  const float* w, const float* b, S* cpre, S* xc) {
  ADJSH_GRID_LOOP(k, M * Di) {
    const int64_t t = k / Di, i = k % Di;
    float c = b[i];
    for (int64_t j = 0; j < W; ++j) {
      const int64_t p = halo + t - (W - 1) + j;
      if (p >= 0) c += w[i * W + j] * Load(xz + p * 2 * Di + i);
    }
    if (cpre) Store(cpre + k, c);
    Store(xc + k, SiluF(c));
  }
}

template <typename S>
__global__ void ConvGateGradKernel(const S* cpre, int64_t n, float* dxc) {
  ADJSH_GRID_LOOP(k, n) dxc[k] *= SiluGradF(Load(cpre + k));
}

// dx[p, i] = sum_j w[i, j] dc[p - halo + W - 1 - j, i] over the chunk's own rows t.
template <typename S>
__global__ void ConvInputGradKernel(const float* dc, int64_t halo, int64_t len, int64_t Di,
                                    int64_t W, const float* w, S* dxz) {
  ADJSH_GRID_LOOP(k, (halo + len) * Di) {
    const int64_t p = k / Di, i = k % Di;
    float acc = 0;
    for (int64_t j = 0; j < W; ++j) {
      const int64_t t = p - halo + (W - 1) - j;
      if (t >= 0 && t < len) acc += w[i * W + j] * dc[t * Di + i];
    }
    Store(dxz + p * 2 * Di + i, acc);
  }
}

// Stage 1 of db[i] = sum_t dc[t, i] and dw[i, j] = sum_t dc[t, i] x[halo + t - W + 1 + j, i]
// (rows before 0 are zero): partial (slices, Di, W + 1), entry 0 db, entry 1 + j dw[:, j].
template <typename S>
__global__ void ConvWeightGradPartialKernel(const S* xz, const float* dc, int64_t halo,
                                            int64_t len, int64_t Di, int64_t W, int64_t slices,
                                            float* partial) {
  __shared__ float shared[kThreads];
  const ReduceCell cell = ThisReduceCell(len, slices);
  const int64_t i = cell.col;
  for (int64_t j = -1; j < W; ++j) {  // j = -1: the bias
    float acc = 0;
    if (i < Di) {
      for (int64_t t = cell.lb; t < cell.le; ++t) {
        if (j < 0) {
          acc += dc[t * Di + i];
        } else {
          const int64_t p = halo + t - (W - 1) + j;
          if (p >= 0) acc += dc[t * Di + i] * Load(xz + p * 2 * Di + i);
        }
      }
    }
    acc = LaneSum(acc, shared);
    if (threadIdx.x < kReduceCols && i < Di) {
      partial[(int64_t{blockIdx.y} * Di + i) * (W + 1) + j + 1] = acc;
    }
  }
}

// Splits the summed (Di, W + 1) block into db (Di) and dw (Di, W).
__global__ void ConvSplitGradKernel(const float* sums, int64_t Di, int64_t W, float* dw,
                                    float* db) {
  ADJSH_GRID_LOOP(k, Di * (W + 1)) {
    const int64_t i = k / (W + 1), j = k % (W + 1);
    if (j == 0) {
      db[i] = sums[k];
    } else {
      dw[i * W + j - 1] = sums[k];
    }
  }
}

template <typename S>
__global__ void ConvertKernel(const float* in, int64_t n, S* out) {
  ADJSH_GRID_LOOP(k, n) Store(out + k, in[k]);
}

__global__ void AddKernel(const float* a, const float* b, int64_t n, float* out) {
  ADJSH_GRID_LOOP(k, n) out[k] = a[k] + b[k];
}

// v = exp(A S) v + add per (i, n) (kernels/decay.h DecayAdd: a state or adjoint carried across
// a chunk plus what the chunk adds); sigma (Di) += S, when given, by the first lane of each row.
__global__ void DecayFoldKernel(const float* A, const float* S, const float* add, int64_t DiN,
                                int64_t N, float* v, float* sigma) {
  ADJSH_GRID_LOOP(q, DiN) {
    const int64_t i = q / N;
    v[q] = expf(A[q] * S[i]) * v[q] + add[q];
    if (sigma != nullptr && q % N == 0) sigma[i] += S[i];
  }
}

// rows (n, D) = table[ids] (f32 rows of a (V, D) table).
__global__ void GatherRowsKernel(const float* table, const uint32_t* ids, int64_t n, int64_t D,
                                 float* rows) {
  ADJSH_GRID_LOOP(k, n * D) rows[k] = table[int64_t{ids[k / D]} * D + k % D];
}

// table[ids[t]] += rows[t] for t = 0..n-1 in that order, one thread per column: each entry's
// sum is taken in token order, as the host's lookup backward takes it (no atomics).
__global__ void ScatterAddRowsKernel(const float* rows, const uint32_t* ids, int64_t n,
                                     int64_t D, float* table) {
  ADJSH_GRID_LOOP(d, D) {
    for (int64_t t = 0; t < n; ++t) table[int64_t{ids[t]} * D + d] += rows[t * D + d];
  }
}

__global__ void CopyFloatsKernel(const float* src, int64_t n, float* dst) {
  ADJSH_GRID_LOOP(k, n) dst[k] = src[k];
}

__global__ void ZeroFloatsKernel(int64_t n, float* dst) {
  ADJSH_GRID_LOOP(k, n) dst[k] = 0.0f;
}

__global__ void WidenIdsKernel(const uint16_t* packed, int64_t n, uint32_t* ids) {
  ADJSH_GRID_LOOP(k, n) ids[k] = packed[k];
}

__global__ void MarkNonFiniteKernel(const float* src, int64_t n, float* flag) {
  ADJSH_GRID_LOOP(k, n) {
    if (!(fabsf(src[k]) <= 3.402823466e38f)) flag[0] = 1.0f;  // NaN fails every comparison
  }
}

__global__ void NextTargetsKernel(const uint32_t* next_ids, int64_t valid, int64_t n,
                                  int64_t* targets) {
  ADJSH_GRID_LOOP(t, n) targets[t] = t < valid ? int64_t{next_ids[t]} : -1;
}

// *loss += log(sum) - (tlogit - mx) over the rows with a target, in row order, one thread (the
// host head's sum, in double, where the rows are).
__global__ void CeLossAddKernel(const float* mx, const float* sum, const float* tlogit,
                                const int64_t* targets, int64_t M, double* loss) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double acc = *loss;
  for (int64_t t = 0; t < M; ++t) {
    if (targets[t] < 0) continue;
    acc += static_cast<double>(logf(sum[t])) - static_cast<double>(tlogit[t] - mx[t]);
  }
  *loss = acc;
}

__global__ void CeStatsKernel(const float* logits, int64_t Vb, int64_t v0, const int64_t* targets,
                              bool first, float* mx, float* sum, float* tlogit) {
  __shared__ float shared[kThreads];
  const int64_t row = blockIdx.x;
  const float* l = logits + row * Vb;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < Vb; v += blockDim.x) m = fmaxf(m, l[v]);
  m = BlockMax(m, shared);
  float s = 0;
  for (int64_t v = threadIdx.x; v < Vb; v += blockDim.x) s += expf(l[v] - m);
  s = BlockSum(s, shared);
  if (threadIdx.x == 0) {
    if (first) {
      mx[row] = m, sum[row] = s;
    } else {
      const float m_new = fmaxf(mx[row], m);
      sum[row] = sum[row] * expf(mx[row] - m_new) + s * expf(m - m_new);
      mx[row] = m_new;
    }
    const int64_t target = targets[row];
    if (target >= v0 && target < v0 + Vb) tlogit[row] = l[target - v0];
  }
}

template <typename S>
__global__ void CeGradKernel(const float* logits, int64_t M, int64_t Vb, int64_t v0,
                             const int64_t* targets, const float* mx, const float* sum,
                             float scale, S* dlogits) {
  ADJSH_GRID_LOOP(k, M * Vb) {
    const int64_t row = k / Vb, v = k % Vb, target = targets[row];
    float d = 0;
    if (target >= 0) {
      d = expf(logits[k] - mx[row]) * (scale / sum[row]);
      if (v0 + v == target) d -= scale;
    }
    Store(dlogits + k, d);
  }
}

// The launches (s: the stream; unused when the kernels run on the host).
template <typename S>
void RmsNormForwardImpl(cudaStream_t s, const float* u, int64_t rows, int64_t D, const float* w,
                        float eps, S* n, float* r) {
  (void)s;
  if (rows == 0) return;
  ADJSH_LAUNCH(RmsNormForwardKernel<S>, dim3(static_cast<unsigned>(rows)), kThreads, s, u, D, w,
               eps, n, r);
}

// Floats of the weight gradients' partial sums (ops.h).
inline int64_t RmsNormBackwardScratchImpl(int64_t rows, int64_t D) {
  return ReduceSlices(rows) * D;
}
inline int64_t ConvSiluBackwardScratchImpl(int64_t len, int64_t Di, int64_t W) {
  // The slices' partials, then their sums (split into dw and db).
  return (ReduceSlices(len) + 1) * Di * (W + 1);
}

inline unsigned ColumnBlocks(int64_t n) {
  return static_cast<unsigned>((n + kReduceCols - 1) / kReduceCols);
}

// dw of RmsNormBackward alone (scratch: RmsNormBackwardScratchImpl(rows, D) floats).
inline void RmsNormWeightGradImpl(cudaStream_t s, const float* u, int64_t rows, int64_t D,
                                  const float* r, const float* dn, float* dw, float* scratch) {
  (void)s;
  if (D == 0) return;
  const int64_t slices = ReduceSlices(rows);
  ADJSH_LAUNCH(RmsNormWeightGradPartialKernel,
               dim3(ColumnBlocks(D), static_cast<unsigned>(slices)), kThreads, s, u, rows, D, r,
               dn, slices, scratch);
  ADJSH_LAUNCH(SumSlicesKernel, dim3(GridFor(D, kThreads)), kThreads, s, scratch, slices, D, dw);
}

inline void RmsNormBackwardImpl(cudaStream_t s, const float* u, int64_t rows, int64_t D,
                                const float* w, const float* r, const float* dn, float* dw,
                                float* du, float* scratch) {
  (void)s;
  if (D == 0) return;
  // The weight gradient reads dn before the row kernel overwrites it (du may alias dn).
  RmsNormWeightGradImpl(s, u, rows, D, r, dn, dw, scratch);
  if (rows == 0) return;
  ADJSH_LAUNCH(RmsNormBackwardRowsKernel, dim3(static_cast<unsigned>(rows)), kThreads, s, u, D, w,
               r, dn, du);
}

template <typename S>
void ConvSiluForwardImpl(cudaStream_t s, const S* xz, int64_t halo, int64_t M, int64_t Di,
                         int64_t W, const float* w, const float* b, S* cpre, S* xc) {
  (void)s;
  ADJSH_LAUNCH(ConvForwardKernel<S>, dim3(GridFor(M * Di, kThreads)), kThreads, s, xz, halo, M,
               Di, W, w, b, cpre, xc);
}

// dw and db of ConvSiluBackward alone, from dc = dL/dcpre (len, Di) (scratch:
// ConvSiluBackwardScratchImpl(len, Di, W) floats).
template <typename S>
void ConvWeightGradImpl(cudaStream_t s, const S* xz, const float* dc, int64_t halo, int64_t len,
                        int64_t Di, int64_t W, float* dw, float* db, float* scratch) {
  (void)s;
  if (Di == 0) return;
  const int64_t slices = ReduceSlices(len), n = Di * (W + 1);
  float* sums = scratch + slices * n;
  ADJSH_LAUNCH(ConvWeightGradPartialKernel<S>,
               dim3(ColumnBlocks(Di), static_cast<unsigned>(slices)), kThreads, s, xz, dc, halo,
               len, Di, W, slices, scratch);
  ADJSH_LAUNCH(SumSlicesKernel, dim3(GridFor(n, kThreads)), kThreads, s, scratch, slices, n, sums);
  ADJSH_LAUNCH(ConvSplitGradKernel, dim3(GridFor(n, kThreads)), kThreads, s, sums, Di, W, dw, db);
}

template <typename S>
void ConvSiluBackwardImpl(cudaStream_t s, const S* xz, const S* cpre, int64_t halo, int64_t len,
                          int64_t Di, int64_t W, const float* w, float* dxc, S* dxz, float* dw,
                          float* db, float* scratch) {
  (void)s;
  if (Di == 0) return;
  ADJSH_LAUNCH(ConvGateGradKernel<S>, dim3(GridFor(len * Di, kThreads)), kThreads, s, cpre,
               len * Di, dxc);
  ADJSH_LAUNCH(ConvInputGradKernel<S>, dim3(GridFor((halo + len) * Di, kThreads)), kThreads, s,
               dxc, halo, len, Di, W, w, dxz);
  ConvWeightGradImpl<S>(s, xz, dxc, halo, len, Di, W, dw, db, scratch);
}

template <typename S>
void ConvertImpl(cudaStream_t s, const float* in, int64_t n, S* out) {
  (void)s;
  if (n == 0) return;
  ADJSH_LAUNCH(ConvertKernel<S>, dim3(GridFor(n, kThreads)), kThreads, s, in, n, out);
}

inline void AddImpl(cudaStream_t s, const float* a, const float* b, int64_t n, float* out) {
  (void)s;
  if (n == 0) return;
  ADJSH_LAUNCH(AddKernel, dim3(GridFor(n, kThreads)), kThreads, s, a, b, n, out);
}

inline void DecayFoldImpl(cudaStream_t s, const float* A, const float* S, const float* add,
                          int64_t Di, int64_t N, float* v, float* sigma) {
  (void)s;
  if (Di * N == 0) return;
  ADJSH_LAUNCH(DecayFoldKernel, dim3(GridFor(Di * N, kThreads)), kThreads, s, A, S, add, Di * N,
               N, v, sigma);
}

inline void GatherRowsImpl(cudaStream_t s, const float* table, const uint32_t* ids, int64_t n,
                           int64_t D, float* rows) {
  (void)s;
  if (n * D == 0) return;
  ADJSH_LAUNCH(GatherRowsKernel, dim3(GridFor(n * D, kThreads)), kThreads, s, table, ids, n, D,
               rows);
}

inline void ScatterAddRowsImpl(cudaStream_t s, const float* rows, const uint32_t* ids, int64_t n,
                               int64_t D, float* table) {
  (void)s;
  if (n * D == 0) return;
  ADJSH_LAUNCH(ScatterAddRowsKernel, dim3(GridFor(D, kThreads)), kThreads, s, rows, ids, n, D,
               table);
}

inline void CopyFloatsImpl(cudaStream_t s, const float* src, int64_t n, float* dst) {
  (void)s;
  if (n == 0 || src == dst) return;
  ADJSH_LAUNCH(CopyFloatsKernel, dim3(GridFor(n, kThreads)), kThreads, s, src, n, dst);
}

inline void ZeroFloatsImpl(cudaStream_t s, int64_t n, float* dst) {
  (void)s;
  if (n == 0) return;
  ADJSH_LAUNCH(ZeroFloatsKernel, dim3(GridFor(n, kThreads)), kThreads, s, n, dst);
}

inline void WidenIdsImpl(cudaStream_t s, const uint16_t* packed, int64_t n, uint32_t* ids) {
  (void)s;
  if (n == 0) return;
  ADJSH_LAUNCH(WidenIdsKernel, dim3(GridFor(n, kThreads)), kThreads, s, packed, n, ids);
}

inline void MarkNonFiniteImpl(cudaStream_t s, const float* src, int64_t n, float* flag) {
  (void)s;
  if (n == 0) return;
  ADJSH_LAUNCH(MarkNonFiniteKernel, dim3(GridFor(n, kThreads)), kThreads, s, src, n, flag);
}

inline void NextTargetsImpl(cudaStream_t s, const uint32_t* next_ids, int64_t valid, int64_t n,
                            int64_t* targets) {
  (void)s;
  if (n == 0) return;
  ADJSH_LAUNCH(NextTargetsKernel, dim3(GridFor(n, kThreads)), kThreads, s, next_ids, valid, n,
               targets);
}

inline void CeLossAddImpl(cudaStream_t s, const float* mx, const float* sum, const float* tlogit,
                          const int64_t* targets, int64_t M, double* loss) {
  (void)s;
  if (M == 0) return;
  ADJSH_LAUNCH(CeLossAddKernel, dim3(1), 1, s, mx, sum, tlogit, targets, M, loss);
}

inline void CeStatsImpl(cudaStream_t s, const float* logits, int64_t M, int64_t Vb, int64_t v0,
                        const int64_t* targets, bool first, float* mx, float* sum,
                        float* tlogit) {
  (void)s;
  if (M == 0) return;
  ADJSH_LAUNCH(CeStatsKernel, dim3(static_cast<unsigned>(M)), kThreads, s, logits, Vb, v0,
               targets, first, mx, sum, tlogit);
}

template <typename S>
void CeGradImpl(cudaStream_t s, const float* logits, int64_t M, int64_t Vb, int64_t v0,
                const int64_t* targets, const float* mx, const float* sum, float scale,
                S* dlogits) {
  (void)s;
  if (M == 0) return;
  ADJSH_LAUNCH(CeGradKernel<S>, dim3(GridFor(M * Vb, kThreads)), kThreads, s, logits, M, Vb, v0,
               targets, mx, sum, scale, dlogits);
}

}  // namespace adjsh::cuda::ops_internal

#endif  // ADJSH_KERNELS_CUDA_OPS_KERNELS_CUH_
