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

// dw[d] = sum_rows dn[row, d] u[row, d] r[row]: one thread per d, rows in order.
__global__ void RmsNormWeightGradKernel(const float* u, int64_t rows, int64_t D, const float* r,
                                        const float* dn, float* dw) {
  ADJSH_GRID_LOOP(d, D) {
    float acc = 0;
    for (int64_t t = 0; t < rows; ++t) acc += dn[t * D + d] * u[t * D + d] * r[t];
    dw[d] = acc;
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

// One thread per channel, rows in order: dw[i, j] = sum_t dc[t, i] x[halo + t - W + 1 + j, i].
template <typename S>
__global__ void ConvWeightGradKernel(const S* xz, const float* dc, int64_t halo, int64_t len,
                                     int64_t Di, int64_t W, float* dw, float* db) {
  ADJSH_GRID_LOOP(i, Di) {
    float acc_b = 0;
    for (int64_t t = 0; t < len; ++t) acc_b += dc[t * Di + i];
    db[i] = acc_b;
    for (int64_t j = 0; j < W; ++j) {
      float acc = 0;
      for (int64_t t = 0; t < len; ++t) {
        const int64_t p = halo + t - (W - 1) + j;
        if (p >= 0) acc += dc[t * Di + i] * Load(xz + p * 2 * Di + i);
      }
      dw[i * W + j] = acc;
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

inline void RmsNormBackwardImpl(cudaStream_t s, const float* u, int64_t rows, int64_t D,
                                const float* w, const float* r, const float* dn, float* dw,
                                float* du) {
  (void)s;
  // The weight gradient reads dn before the row kernel overwrites it (du may alias dn).
  ADJSH_LAUNCH(RmsNormWeightGradKernel, dim3(GridFor(D, kThreads)), kThreads, s, u, rows, D, r,
               dn, dw);
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

template <typename S>
void ConvSiluBackwardImpl(cudaStream_t s, const S* xz, const S* cpre, int64_t halo, int64_t len,
                          int64_t Di, int64_t W, const float* w, float* dxc, S* dxz, float* dw,
                          float* db) {
  (void)s;
  ADJSH_LAUNCH(ConvGateGradKernel<S>, dim3(GridFor(len * Di, kThreads)), kThreads, s, cpre,
               len * Di, dxc);
  ADJSH_LAUNCH(ConvInputGradKernel<S>, dim3(GridFor((halo + len) * Di, kThreads)), kThreads, s,
               dxc, halo, len, Di, W, w, dxz);
  ADJSH_LAUNCH(ConvWeightGradKernel<S>, dim3(GridFor(Di, 128)), 128, s, xz, dxc, halo, len, Di, W,
               dw, db);
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
