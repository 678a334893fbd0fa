// The kernels of one Mamba-2 layer over one chunk (kernels/cuda/mamba2_block.h), as a header:
// mamba2_block.cu compiles them for the GPU; tests/cuda/mamba2_emulation_test.cc compiles the
// same code for the host (tests/cuda/host_emulation.h). Launches go through ADJSH_LAUNCH
// (kernels/cuda/launch.cuh, or the emulation's). Letters as kernels/cpu/mamba2_layer.h; the chunk
// has L rows, hb halo rows before it (hb = min(W - 1, t0)), zx (hb + L, Dp) = [z | xBC | dt_raw].
// Every sum runs in an order fixed by the shape (a thread's own loop, or BlockSum's tree over a
// block whose size depends on the shape alone), never through atomics: results are bitwise the
// same run to run.
#ifndef ADJSH_KERNELS_CUDA_MAMBA2_KERNELS_CUH_
#define ADJSH_KERNELS_CUDA_MAMBA2_KERNELS_CUH_

#include <cstdint>

#include "kernels/cuda/device_math.cuh"

namespace adjsh::cuda::mamba2_internal {

constexpr int kThreads = 128;          // element-wise kernels (grid-stride loops)
constexpr int kMaxBlockThreads = 256;  // kernels with one block per row, group or head
constexpr int64_t kScanBlock = 64;     // rows per block of the scan backward's recomputed states

// Threads of a block that works over n items: the power of two >= n in [32, 256]. A function
// of the shape alone, so that BlockSum's tree (the order of the sum) is too.
inline int BlockThreadsFor(int64_t n) {
  int t = 32;
  while (t < n && t < kMaxBlockThreads) t *= 2;
  return t;
}

// One chunk's scan inputs (kernels/cpu/mamba2_scan.h Mamba2ScanRows), device pointers.
struct Mamba2ScanArgs {
  int64_t L, H, P, G, N, Di, Cc;
  const float* dt;     // (L, H)
  const float* xbc;    // (L, Cc): [x | B | C]
  const float* A;      // (H): -exp(A_log)
  const float* Dskip;  // (H)
};

// pre (L, Cc) = conv_b + sum_j conv_w[:, j] xBC[hb + i - W + 1 + j] (rows before the sequence
// read zero), xbc = silu(pre).
__global__ void ConvForwardKernel(const float* zx, int64_t hb, int64_t L, int64_t Di, int64_t Dp,
                                  int64_t Cc, int64_t W, const float* w, const float* b,
                                  float* pre, float* xbc) {
  ADJSH_GRID_LOOP(k, L * Cc) {
    const int64_t i = k / Cc, c = k % Cc;
    float acc = b[c];
    for (int64_t j = 0; j < W; ++j) {
      const int64_t s = hb + i - (W - 1) + j;
      if (s >= 0) acc += w[c * W + j] * zx[s * Dp + Di + c];
    }
    pre[k] = acc;
    xbc[k] = SiluF(acc);
  }
}

// dt (L, H) = softplus(dt_raw + dt_bias), clamped to [lo, hi] when `clamped`; dt_raw is zx's
// column off + h.
__global__ void DtForwardKernel(const float* zx, int64_t hb, int64_t L, int64_t H, int64_t Dp,
                                int64_t off, const float* dt_bias, bool clamped, float lo,
                                float hi, float* dt) {
  ADJSH_GRID_LOOP(k, L * H) {
    const int64_t i = k / H, h = k % H;
    float v = SoftplusF(zx[(hb + i) * Dp + off + h] + dt_bias[h]);
    if (clamped) v = fminf(fmaxf(v, lo), hi);
    dt[k] = v;
  }
}

// sigma (H P) += each head's dt (L, H) over the rows, in row order, into every one of its P
// entries (a span's delta sums repeat the head's over its channels): the host's running sum
// per head, taken by each entry alone.
__global__ void DtSigmaKernel(const float* dt, int64_t L, int64_t H, int64_t P, float* sigma) {
  ADJSH_GRID_LOOP(q, H * P) {
    const int64_t h = q / P;
    float v = sigma[q];
    for (int64_t i = 0; i < L; ++i) v += dt[i * H + h];
    sigma[q] = v;
  }
}

// The scan forward, one block per head h, its threads over the (P, N) state elements:
// S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T in place in S (H, P, N); with y non-null also
// y_t (L, Di) = S_t C_t + D_h x_t, the sum over N through prod (H, P, N) in order of n; with
// ckpt non-null the state before every kScanBlock-th row into ckpt (H, blocks, P, N).
__global__ void ScanForwardKernel(Mamba2ScanArgs r, float* S, float* y, float* prod, float* ckpt) {
  const int64_t h = blockIdx.x, g = h / (r.H / r.G), PN = r.P * r.N;
  const int64_t blocks = (r.L + kScanBlock - 1) / kScanBlock;
  const float A = r.A[h], Dh = r.Dskip[h];
  float* Sh = S + h * PN;
  float* ph = prod + h * PN;
  for (int64_t i = 0; i < r.L; ++i) {
    if (ckpt && i % kScanBlock == 0) {
      float* dst = ckpt + (h * blocks + i / kScanBlock) * PN;
      for (int64_t q = threadIdx.x; q < PN; q += blockDim.x) dst[q] = Sh[q];
    }
    const float dt = r.dt[i * r.H + h], decay = expf(dt * A);
    const float* x = r.xbc + i * r.Cc + h * r.P;
    const float* B = r.xbc + i * r.Cc + r.Di + g * r.N;
    const float* C = B + r.G * r.N;
    for (int64_t q = threadIdx.x; q < PN; q += blockDim.x) {
      const int64_t p = q / r.N, n = q % r.N;
      const float s = decay * Sh[q] + dt * x[p] * B[n];
      Sh[q] = s;
      if (y) ph[q] = s * C[n];
    }
    if (y == nullptr) continue;  // uniform over the block
    __syncthreads();
    for (int64_t p = threadIdx.x; p < r.P; p += blockDim.x) {
      float acc = 0;
      for (int64_t n = 0; n < r.N; ++n) acc += ph[p * r.N + n];
      y[i * r.Di + h * r.P + p] = acc + Dh * x[p];
    }
    __syncthreads();  // prod is rewritten by the next row
  }
}

// The carry alone (kernels/cpu/mamba2_scan.cc PlainAdjoint), one block per head, each thread its own
// state elements: carry = exp(dt_t A) (carry + dy_t C_t^T) from the last row to the first.
__global__ void ScanAdjointKernel(Mamba2ScanArgs r, const float* dy, float* carry) {
  const int64_t h = blockIdx.x, g = h / (r.H / r.G), PN = r.P * r.N;
  const float A = r.A[h];
  float* ch = carry + h * PN;
  for (int64_t i = r.L - 1; i >= 0; --i) {
    const float decay = expf(r.dt[i * r.H + h] * A);
    const float* C = r.xbc + i * r.Cc + r.Di + r.G * r.N + g * r.N;
    const float* dyt = dy + i * r.Di + h * r.P;
    for (int64_t q = threadIdx.x; q < PN; q += blockDim.x) {
      const int64_t p = q / r.N, n = q % r.N;
      ch[q] = decay * (ch[q] + dyt[p] * C[n]);
    }
  }
}

// Two block sums at once in BlockSum's fixed tree order (device_math.cuh); shared holds
// 2 blockDim.x floats.
__device__ __forceinline__ void BlockSum2(float* a, float* b, float* shared) {
  const unsigned t = threadIdx.x, n = blockDim.x;
  shared[t] = *a;
  shared[n + t] = *b;
  __syncthreads();
  for (unsigned s = n / 2; s > 0; s /= 2) {
    if (t < s) {
      shared[t] += shared[t + s];
      shared[n + t] += shared[n + t + s];
    }
    __syncthreads();
  }
  *a = shared[0];
  *b = shared[n];
  __syncthreads();
}

// The scan backward (kernels/cpu/mamba2_scan.cc PlainBackward), one block per head. The states are
// recomputed per block of kScanBlock rows from ckpt (ScanForwardKernel's) into states
// (H, kScanBlock + 1, P, N), then the rows run in reverse with G_t = carry + dy_t C_t^T held
// in carry:
//   dx_t = D dy_t + dt_t G_t B_t (dxbc's x columns, written)
//   dB_t, dC_t per head into dBh, dCh (L, H, N) (GroupSumKernel adds a group's heads)
//   ddt_t (L, H) = x_t^T G_t B_t + A exp(dt_t A) <G_t, S_{t-1}>
//   dA_log (H) = A sum_t exp(dt_t A) dt_t <G_t, S_{t-1}>, dD (H) = sum_t dy_t . x_t (written)
// carry is left as dL/dS_{t0-1}.
__global__ void ScanBackwardKernel(Mamba2ScanArgs r, const float* dy, float* carry,
                                   const float* ckpt, float* states, float* dxbc, float* dBh,
                                   float* dCh, float* ddt, float* dA_log, float* dD) {
  __shared__ float shared[2 * kMaxBlockThreads];
  const int64_t h = blockIdx.x, g = h / (r.H / r.G), PN = r.P * r.N, N = r.N;
  const int64_t blocks = (r.L + kScanBlock - 1) / kScanBlock;
  const float A = r.A[h], Dh = r.Dskip[h];
  float* ch = carry + h * PN;
  float* st = states + h * (kScanBlock + 1) * PN;
  float dAh = 0, dDt = 0;
  for (int64_t b = blocks - 1; b >= 0; --b) {
    const int64_t i0 = b * kScanBlock, i1 = i0 + kScanBlock < r.L ? i0 + kScanBlock : r.L;
    // st[k] = the state before row i0 + k, k in [0, i1 - i0].
    for (int64_t q = threadIdx.x; q < PN; q += blockDim.x) {
      const int64_t p = q / N, n = q % N;
      float s = ckpt[(h * blocks + b) * PN + q];
      st[q] = s;
      for (int64_t i = i0; i < i1; ++i) {
        const float dt = r.dt[i * r.H + h];
        const float* xi = r.xbc + i * r.Cc + h * r.P;
        const float* Bi = r.xbc + i * r.Cc + r.Di + g * N;
        s = expf(dt * A) * s + dt * xi[p] * Bi[n];
        st[(i - i0 + 1) * PN + q] = s;
      }
    }
    __syncthreads();
    for (int64_t i = i1 - 1; i >= i0; --i) {
      const float dt = r.dt[i * r.H + h], decay = expf(dt * A);
      const float* x = r.xbc + i * r.Cc + h * r.P;
      const float* B = r.xbc + i * r.Cc + r.Di + g * N;
      const float* C = B + r.G * N;
      const float* dyt = dy + i * r.Di + h * r.P;
      const float* St = st + (i - i0 + 1) * PN;
      const float* Sprev = st + (i - i0) * PN;
      for (int64_t q = threadIdx.x; q < PN; q += blockDim.x)
        ch[q] += dyt[q / N] * C[q % N];  // G_t
      __syncthreads();
      float GS = 0, xGB = 0;
      for (int64_t q = threadIdx.x; q < PN; q += blockDim.x) GS += ch[q] * Sprev[q];
      for (int64_t p = threadIdx.x; p < r.P; p += blockDim.x) {
        float GB = 0;
        for (int64_t n = 0; n < N; ++n) GB += ch[p * N + n] * B[n];
        dxbc[i * r.Cc + h * r.P + p] = Dh * dyt[p] + dt * GB;
        xGB += x[p] * GB;
        dDt += dyt[p] * x[p];
      }
      for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        float dc = 0, db = 0;
        for (int64_t p = 0; p < r.P; ++p) {
          dc += St[p * N + n] * dyt[p];
          db += dt * x[p] * ch[p * N + n];
        }
        dCh[(i * r.H + h) * N + n] = dc;
        dBh[(i * r.H + h) * N + n] = db;
      }
      BlockSum2(&GS, &xGB, shared);  // ends with a barrier: every read of G_t is done
      if (threadIdx.x == 0) ddt[i * r.H + h] = xGB + A * decay * GS;
      dAh += decay * dt * GS;
      for (int64_t q = threadIdx.x; q < PN; q += blockDim.x) ch[q] *= decay;  // dL/dS_{t-1}
    }
    __syncthreads();  // st is rewritten by the next block
  }
  float unused = 0;
  BlockSum2(&dDt, &unused, shared);
  if (threadIdx.x == 0) {
    dA_log[h] = dAh * A;  // A = -exp(A_log): dA/dA_log = A
    dD[h] = dDt;
  }
}

// dxbc's B and C columns (L, 2 G N) = the sums of dBh, dCh (L, H, N) over the H / G heads of
// each group, in head order.
__global__ void GroupSumKernel(const float* dBh, const float* dCh, int64_t L, int64_t H,
                               int64_t G, int64_t N, int64_t Di, int64_t Cc, float* dxbc) {
  const int64_t GN = G * N, rep = H / G;
  ADJSH_GRID_LOOP(k, L * 2 * GN) {
    const int64_t i = k / (2 * GN), col = k % (2 * GN);
    const float* src = col < GN ? dBh : dCh;
    const int64_t g = (col % GN) / N, n = col % N;
    float acc = 0;
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h) acc += src[(i * H + h) * N + n];
    dxbc[i * Cc + Di + col] = acc;
  }
}

// The gated norm, one block per (row i, group j) of M = Di / G channels: gv = y silu(z),
// r2 (L, G) = 1 / sqrt(mean(gv^2) + eps), n = gv r2 gnorm.
__global__ void GatedNormForwardKernel(const float* y, const float* zx, int64_t hb, int64_t Dp,
                                       int64_t Di, int64_t G, const float* gnorm, float eps,
                                       float* gv, float* r2, float* n) {
  __shared__ float shared[kMaxBlockThreads];
  const int64_t i = blockIdx.x, j = blockIdx.y, M = Di / G, o = i * Di + j * M;
  float ss = 0;
  for (int64_t c = threadIdx.x; c < M; c += blockDim.x) {
    const float v = y[o + c] * SiluF(zx[(hb + i) * Dp + j * M + c]);
    gv[o + c] = v;
    ss += v * v;
  }
  ss = BlockSum(ss, shared);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(M) + eps);
  if (threadIdx.x == 0) r2[i * G + j] = r;
  for (int64_t c = threadIdx.x; c < M; c += blockDim.x) n[o + c] = gv[o + c] * r * gnorm[j * M + c];
}

// Its backward (kernels/cpu/mamba2_layer.cc GatedNormBackward) per (row, group) block: dy (L, Di)
// from dn; with dzx non-null dz into its z columns (L rows of Dp).
__global__ void GatedNormBackwardKernel(const float* dn, const float* gv, const float* y,
                                        const float* r2, const float* zx, int64_t hb, int64_t Dp,
                                        int64_t Di, int64_t G, const float* gnorm, float* dy,
                                        float* dzx) {
  __shared__ float shared[kMaxBlockThreads];
  const int64_t i = blockIdx.x, j = blockIdx.y, M = Di / G, o = i * Di + j * M;
  const float r = r2[i * G + j];
  float dot = 0;
  for (int64_t c = threadIdx.x; c < M; c += blockDim.x)
    dot += dn[o + c] * gnorm[j * M + c] * gv[o + c];
  dot = BlockSum(dot, shared);
  const float coef = r * r * r * dot / static_cast<float>(M);
  for (int64_t c = threadIdx.x; c < M; c += blockDim.x) {
    const float dg = r * dn[o + c] * gnorm[j * M + c] - gv[o + c] * coef;
    const float z = zx[(hb + i) * Dp + j * M + c], s = SigmoidF(z);
    dy[o + c] = dg * z * s;
    if (dzx) dzx[i * Dp + j * M + c] = dg * y[o + c] * s * (1.0f + z * (1.0f - s));
  }
}

// The gated norm's weight gradient (Di) = sum over rows of dn gv r2, a thread per channel.
__global__ void GnormGradKernel(const float* dn, const float* gv, const float* r2, int64_t L,
                                int64_t Di, int64_t G, float* out) {
  const int64_t M = Di / G;
  ADJSH_GRID_LOOP(c, Di) {
    float acc = 0;
    for (int64_t i = 0; i < L; ++i) acc += dn[i * Di + c] * gv[i * Di + c] * r2[i * G + c / M];
    out[c] = acc;
  }
}

// dt_raw's gradient into dzx's dt columns (column off + h of L rows): ddt sigmoid(dt_raw +
// dt_bias), zero where the clamp held dt (as kernels/cpu/mamba2_layer.cc).
__global__ void DtBackwardKernel(const float* ddt, const float* zx, int64_t hb, int64_t L,
                                 int64_t H, int64_t Dp, int64_t off, const float* dt_bias,
                                 bool clamped, float lo, float hi, float* dzx) {
  ADJSH_GRID_LOOP(k, L * H) {
    const int64_t i = k / H, h = k % H;
    const float x = zx[(hb + i) * Dp + off + h] + dt_bias[h];
    bool pass = true;
    if (clamped) {
      const float v = SoftplusF(x);
      pass = v >= lo && v <= hi;
    }
    dzx[i * Dp + off + h] = pass ? ddt[k] * SigmoidF(x) : 0.0f;
  }
}

// out[c] = sum over rows of X[i * ld + c], c in [0, cols), a thread per column in row order.
__global__ void ColumnSumKernel(const float* X, int64_t rows, int64_t cols, int64_t ld,
                                float* out) {
  ADJSH_GRID_LOOP(c, cols) {
    float acc = 0;
    for (int64_t i = 0; i < rows; ++i) acc += X[i * ld + c];
    out[c] = acc;
  }
}

// dxbc (n items) *= silu'(pre): dL/dpre in place.
__global__ void SiluBackwardKernel(const float* pre, int64_t n, float* dxbc) {
  ADJSH_GRID_LOOP(k, n) dxbc[k] *= SiluGradF(pre[k]);
}

// The conv back to its input rows [t0 - W + 1, t1) (k = row - t0 + W - 1), gathered per row
// and channel: the incoming halo (rows [t1 - W + 1, t1)) plus sum_j dp[row - t0 + W - 1 - j]
// conv_w[:, j]. Rows of the chunk go to dzx's xBC columns (L rows of Dp), rows before t0 to
// halo_out (W - 1, Cc); rows before the sequence's start are zero there.
__global__ void ConvInputGradKernel(const float* dp, const float* halo_in, int64_t t0, int64_t t1,
                                    int64_t Di, int64_t Dp, int64_t Cc, int64_t W,
                                    const float* w, float* dzx, float* halo_out) {
  const int64_t H1 = W - 1, L = t1 - t0;
  ADJSH_GRID_LOOP(k, (H1 + L) * Cc) {
    const int64_t kr = k / Cc, c = k % Cc, row = t0 - H1 + kr;
    if (row < 0) {
      halo_out[kr * Cc + c] = 0.0f;
      continue;
    }
    float v = row >= t1 - H1 ? halo_in[(row - (t1 - H1)) * Cc + c] : 0.0f;
    for (int64_t j = 0; j < W; ++j) {
      const int64_t i = row - t0 + H1 - j;
      if (i >= 0 && i < L) v += dp[i * Cc + c] * w[c * W + j];
    }
    if (row >= t0) {
      dzx[(row - t0) * Dp + Di + c] = v;
    } else {
      halo_out[kr * Cc + c] = v;
    }
  }
}

// conv_w's gradient (Cc, W) = sum over rows of dp[i, c] xBC[hb + i - W + 1 + j, c], a thread
// per weight in row order.
__global__ void ConvWeightGradKernel(const float* dp, const float* zx, int64_t hb, int64_t L,
                                     int64_t Di, int64_t Dp, int64_t Cc, int64_t W, float* dw) {
  ADJSH_GRID_LOOP(k, Cc * W) {
    const int64_t c = k / W, j = k % W;
    float acc = 0;
    for (int64_t i = 0; i < L; ++i) {
      const int64_t s = hb + i - (W - 1) + j;
      if (s >= 0) acc += dp[i * Cc + c] * zx[s * Dp + Di + c];
    }
    dw[k] = acc;
  }
}

// The halo's rows [skip, W - 1) into dzx's xBC columns (n rows of Dp).
__global__ void HaloScatterKernel(const float* halo, int64_t n, int64_t skip, int64_t Di,
                                  int64_t Dp, int64_t Cc, float* dzx) {
  ADJSH_GRID_LOOP(k, n * Cc) {
    const int64_t i = k / Cc, c = k % Cc;
    dzx[i * Dp + Di + c] = halo[(skip + i) * Cc + c];
  }
}

}  // namespace adjsh::cuda::mamba2_internal

#endif  // ADJSH_KERNELS_CUDA_MAMBA2_KERNELS_CUH_
