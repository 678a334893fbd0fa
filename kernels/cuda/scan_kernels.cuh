// The scan kernels of scan.h and their launch sequences, as a header: scan.cu compiles them for
// the GPU; tests/cuda/scan_emulation_test.cc compiles the same code for the host, running each
// block's threads as host threads, so that the kernels' logic is checked without a GPU. A
// launch goes through ADJSH_LAUNCH(kernel, grid, block, stream, args...), which the includer
// defines.
#ifndef ADJSH_KERNELS_CUDA_SCAN_KERNELS_CUH_
#define ADJSH_KERNELS_CUDA_SCAN_KERNELS_CUH_

#include <cstdint>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/scan.h"

namespace adjsh::cuda::scan_internal {

__host__ __device__ __forceinline__ int64_t MinI(int64_t a, int64_t b) { return a < b ? a : b; }


constexpr int kThreads = 256;
constexpr int kTile = 16;     // rows per checkpoint; a tile's states live in registers
constexpr int kSegment = 64;  // rows per segment (a multiple of kTile), unless len is huge
static_assert(kSegment % kTile == 0, "segments hold whole tiles");
constexpr int64_t kMaxSegments = 65535;  // the grid's y extent

inline int Lanes(int64_t N) {
  int L = 1;
  while (L < N) L *= 2;
  return L;
}

inline int64_t Blocks(int64_t Di, int L) {
  const int64_t per_block = kThreads / L;
  return (Di + per_block - 1) / per_block;
}

// Rows per segment: kSegment, or more (whole tiles) when len would need over kMaxSegments.
inline int64_t SegmentRows(int64_t len) {
  const int64_t need = (len + kMaxSegments - 1) / kMaxSegments;
  return need <= kSegment ? kSegment : (need + kTile - 1) / kTile * kTile;
}
inline int64_t Segments(int64_t len) { return (len + SegmentRows(len) - 1) / SegmentRows(len); }

// Sum over the L lanes of a channel (butterfly: lane 0 always adds in the same order).
__device__ __forceinline__ float LaneSum(float v, int L) {
  for (int off = L / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off, L);
  return v;
}

// This thread's channel i and lane n; chan: i < Di; act: also n < N.
struct Lane {
  int n;
  int64_t i;
  bool chan, act;
  __device__ Lane(int L, int64_t Di, int64_t N) {
    n = threadIdx.x % L;
    i = int64_t{blockIdx.x} * (blockDim.x / L) + threadIdx.x / L;
    chan = i < Di;
    act = chan && n < N;
  }
};

// What one row t gives channel i, lane n.
template <typename S>
struct Row {
  float pre = 0, dt = 0, x = 0, B = 0, C = 0;
  __device__ void Load(const ScanArgs<S>& a, int64_t t, const Lane& l, float bias) {
    if (l.chan) {
      pre = cuda::Load(a.dtpre + t * a.Di + l.i) + bias;
      dt = SoftplusF(pre);
      x = cuda::Load(a.xc + t * a.Di + l.i);
    }
    if (l.act) {
      const S* row = a.dbc + t * (a.R + 2 * a.N) + a.R;
      B = cuda::Load(row + l.n);
      C = cuda::Load(row + a.N + l.n);
    }
  }
};

// Segment summaries, one block row per segment (blockIdx.y): hloc = the segment's scan from a
// zero state, dtsum = sum of Delta over it (so that the segment maps h to
// exp(A dtsum) h + hloc), and with d_o the adjoint summary m = a_first lambda_local_first of
// the segment's reverse scan from zero. Layouts: hloc, m (segs, Di, N); dtsum (segs, Di).
template <typename S>
__global__ void __launch_bounds__(kThreads) SegmentSummaryKernel(ScanArgs<S> a, int L,
                                                                 int64_t seg_rows,
                                                                 const float* d_o, float* hloc,
                                                                 float* m, float* dtsum) {
  const Lane l(L, a.Di, a.N);
  const int64_t Di = a.Di, N = a.N, seg = blockIdx.y;
  const int64_t t0 = seg * seg_rows, t1 = MinI(a.len, t0 + seg_rows);
  const float A = l.act ? a.A[l.i * N + l.n] : 0.0f, bias = l.chan ? a.dt_b[l.i] : 0.0f;
  float h = 0, sdt = 0;
#pragma unroll 4
  for (int64_t t = t0; t < t1; ++t) {
    Row<S> r;
    r.Load(a, t, l, bias);
    h = expf(r.dt * A) * h + r.dt * r.x * r.B;
    sdt += r.dt;
  }
  if (l.act) hloc[(seg * Di + l.i) * N + l.n] = h;
  if (l.chan && l.n == 0) dtsum[seg * Di + l.i] = sdt;
  if (!d_o) return;
  float carry = 0;
#pragma unroll 4
  for (int64_t t = t1 - 1; t >= t0; --t) {
    Row<S> r;
    r.Load(a, t, l, bias);
    float yb = 0;
    if (l.chan) yb = d_o[t * Di + l.i] * SiluF(cuda::Load(a.xz + (a.halo + t) * 2 * Di + Di + l.i));
    carry = expf(r.dt * A) * (yb * r.C + carry);
  }
  if (l.act) m[(seg * Di + l.i) * N + l.n] = carry;
}

// The exact combine over segments in order, per (i, n): h_start[s] (the state before segment
// s) from h0, h_end after the last; with m, carry_in[s] (the adjoint a lambda flowing into
// segment s's last row from the next segment; mu for the last) from mu, and m_out (if
// non-null) the adjoint flowing out of the first row (a_0 lambda_0). dt_total (if non-null):
// per channel, sum Delta over the chunk (the segments' sums added in order).
__global__ void __launch_bounds__(kThreads) SegmentCombineKernel(
    int64_t Di, int64_t N, int L, int64_t segs, const float* A_all, const float* h0,
    const float* mu, const float* hloc, const float* m, const float* dtsum, float* h_start,
    float* h_end, float* carry_in, float* m_out, float* dt_total) {
  const Lane l(L, Di, N);
  if (!l.act) return;  // no shuffles here
  const int64_t k = l.i * N + l.n;
  const float A = A_all[k];
  if (dt_total && l.n == 0) {
    float sum = 0;
    for (int64_t s = 0; s < segs; ++s) sum += dtsum[s * Di + l.i];
    dt_total[l.i] = sum;
  }
  float h = h0 ? h0[k] : 0.0f;
  for (int64_t s = 0; s < segs; ++s) {
    h_start[s * Di * N + k] = h;
    h = expf(A * dtsum[s * Di + l.i]) * h + hloc[s * Di * N + k];
  }
  if (h_end) h_end[k] = h;
  if (!m) return;
  float c = mu ? mu[k] : 0.0f;
  for (int64_t s = segs - 1; s >= 0; --s) {
    carry_in[s * Di * N + k] = c;
    c = m[s * Di * N + k] + expf(A * dtsum[s * Di + l.i]) * c;
  }
  if (m_out) m_out[k] = c;
}

// The forward of one segment (blockIdx.y) from its h_start: o = (h . C + D x') silu(z).
template <typename S>
__global__ void __launch_bounds__(kThreads) ScanForwardKernel(ScanArgs<S> a, int L,
                                                              int64_t seg_rows,
                                                              const float* h_start, S* o) {
  const Lane l(L, a.Di, a.N);
  const int64_t Di = a.Di, N = a.N, seg = blockIdx.y;
  const int64_t t0 = seg * seg_rows, t1 = MinI(a.len, t0 + seg_rows);
  const float A = l.act ? a.A[l.i * N + l.n] : 0.0f;
  const float bias = l.chan ? a.dt_b[l.i] : 0.0f, Dsk = l.chan ? a.Dskip[l.i] : 0.0f;
  float h = l.act ? h_start[(seg * Di + l.i) * N + l.n] : 0.0f;
  // Unrolled so that later rows' loads, which do not depend on h, are issued early.
#pragma unroll 4
  for (int64_t t = t0; t < t1; ++t) {
    Row<S> r;
    r.Load(a, t, l, bias);
    h = expf(r.dt * A) * h + r.dt * r.x * r.B;
    const float y = LaneSum(h * r.C, L) + Dsk * r.x;
    if (l.chan && l.n == 0) {
      const float z = cuda::Load(a.xz + (a.halo + t) * 2 * Di + Di + l.i);
      Store(o + t * Di + l.i, y * SiluF(z));
    }
  }
}

// The fused backward of one segment (blockIdx.y) from its h_start and carry_in. Per-(i, n) and
// per-channel sums go to per-segment partials (dA_part, dD_part, dtb_part); dB and dC of the
// block's channels to partial[block][t].
template <typename S>
__global__ void __launch_bounds__(kThreads) ScanBackwardKernel(
    ScanArgs<S> a, ScanBackwardArgs<S> b, int L, int64_t seg_rows, const float* h_start,
    const float* carry_in, float* ckpt, float* partial, float* dA_part, float* dD_part,
    float* dtb_part) {
  __shared__ float sB[kTile * kThreads], sC[kTile * kThreads];
  const Lane l(L, a.Di, a.N);
  const int n = l.n, per_block = blockDim.x / L;
  const int64_t i = l.i, Di = a.Di, N = a.N, len = a.len, DiN = Di * N, seg = blockIdx.y;
  const int64_t t0_seg = seg * seg_rows, t1_seg = MinI(len, t0_seg + seg_rows);
  const bool chan = l.chan, act = l.act;
  const float A = act ? a.A[i * N + n] : 0.0f;
  const float bias = chan ? a.dt_b[i] : 0.0f, Dsk = chan ? a.Dskip[i] : 0.0f;

  // Pass 1: the segment's forward from h_start, keeping the state before every tile.
  float h = act ? h_start[seg * DiN + i * N + n] : 0.0f;
#pragma unroll 4
  for (int64_t t = t0_seg; t < t1_seg; ++t) {
    if (t % kTile == 0 && act) ckpt[(t / kTile) * DiN + i * N + n] = h;
    Row<S> r;
    r.Load(a, t, l, bias);
    h = expf(r.dt * A) * h + r.dt * r.x * r.B;
  }

  // Pass 2: tiles in reverse; carry = a_{t+1} lambda_{t+1} (= carry_in past the last row).
  float carry = act ? carry_in[seg * DiN + i * N + n] : 0.0f;
  float dA = 0, dD = 0, dtb = 0;
  for (int64_t t0 = t0_seg + (t1_seg - 1 - t0_seg) / kTile * kTile; t0 >= t0_seg; t0 -= kTile) {
    const float h_tile = act ? ckpt[(t0 / kTile) * DiN + i * N + n] : 0.0f;
    float hs[kTile];  // hs[k] = h at row t0 + k
    float hh = h_tile;
#pragma unroll
    for (int k = 0; k < kTile; ++k) {
      if (t0 + k < t1_seg) {
        Row<S> r;
        r.Load(a, t0 + k, l, bias);
        hh = expf(r.dt * A) * hh + r.dt * r.x * r.B;
      }
      hs[k] = hh;
    }
#pragma unroll
    for (int k = kTile - 1; k >= 0; --k) {
      const int64_t t = t0 + k;
      float vB = 0, vC = 0;
      if (t < t1_seg) {  // the same for every thread of the block: shuffles stay converged
        Row<S> r;
        r.Load(a, t, l, bias);
        float z = 0, d_o = 0;
        if (chan) {
          z = cuda::Load(a.xz + (a.halo + t) * 2 * Di + Di + i);
          d_o = b.d_o[t * Di + i];
        }
        const float at = expf(r.dt * A);
        const float sz = SiluF(z), yb = d_o * sz;
        const float lam = yb * r.C + carry;
        const float hprev = k > 0 ? hs[k > 0 ? k - 1 : 0] : h_tile;
        const float ga = lam * hprev * at;  // dL/d(Delta_t A[i, n])
        const float y = LaneSum(hs[k] * r.C, L) + Dsk * r.x;
        const float s_a = LaneSum(ga * A, L);
        const float s_b = LaneSum(lam * r.B, L);
        dA += ga * r.dt;
        vB = lam * r.dt * r.x;
        vC = yb * hs[k];
        if (chan && n == 0) {
          const float ddt = (s_a + r.x * s_b) * SigmoidF(r.pre);
          Store(b.ddt + t * Di + i, ddt);
          dtb += ddt;
          b.dxc[t * Di + i] = r.dt * s_b + Dsk * yb;
          dD += yb * r.x;
          Store(b.o + t * Di + i, y * sz);
          Store(b.dxz + (a.halo + t) * 2 * Di + Di + i, d_o * y * SiluGradF(z));
        }
        carry = at * lam;
      }
      sB[k * blockDim.x + threadIdx.x] = vB;
      sC[k * blockDim.x + threadIdx.x] = vC;
    }
    __syncthreads();
    // This block's channels summed in order: partial[block][t][B n | C n].
    for (int q = threadIdx.x; q < kTile * L; q += blockDim.x) {
      const int k = q / L, mm = q % L;
      const int64_t t = t0 + k;
      if (t < t1_seg && mm < N) {
        float acc_b = 0, acc_c = 0;
        for (int c = 0; c < per_block; ++c) {
          acc_b += sB[k * blockDim.x + c * L + mm];
          acc_c += sC[k * blockDim.x + c * L + mm];
        }
        float* out = partial + (int64_t{blockIdx.x} * len + t) * 2 * N;
        out[mm] = acc_b;
        out[N + mm] = acc_c;
      }
    }
    __syncthreads();
  }
  if (act) {
    dA_part[seg * DiN + i * N + n] = dA;
    if (seg == 0 && b.mu_out) b.mu_out[i * N + n] = carry;  // a_0 lambda_0
  }
  if (chan && n == 0) {
    dD_part[seg * Di + i] = dD;
    dtb_part[seg * Di + i] = dtb;
  }
}

// ddbc[t, R + q] = sum over blocks g (in order) of partial[g][t][q], q < 2N.
template <typename S>
__global__ void ReduceBCKernel(const float* partial, int64_t groups, int64_t len, int64_t N,
                               int64_t R, S* ddbc) {
  ADJSH_GRID_LOOP(k, len * 2 * N) {
    const int64_t t = k / (2 * N), q = k % (2 * N);
    float acc = 0;
    for (int64_t g = 0; g < groups; ++g) acc += partial[(g * len + t) * 2 * N + q];
    Store(ddbc + t * (R + 2 * N) + R + q, acc);
  }
}

// The per-segment partials summed over segments in order: dA_log = A sum dA; dD; ddt_b.
__global__ void ReduceSegmentsKernel(const float* dA_part, const float* dD_part,
                                     const float* dtb_part, int64_t segs, int64_t Di, int64_t N,
                                     const float* A, float* dA_log, float* dD, float* ddt_b) {
  ADJSH_GRID_LOOP(k, Di * N) {
    float acc = 0;
    for (int64_t s = 0; s < segs; ++s) acc += dA_part[s * Di * N + k];
    dA_log[k] = acc * A[k];  // dA/dA_log = A
    if (k % N == 0) {
      const int64_t i = k / N;
      float d = 0, b = 0;
      for (int64_t s = 0; s < segs; ++s) d += dD_part[s * Di + i], b += dtb_part[s * Di + i];
      dD[i] = d;
      ddt_b[i] = b;
    }
  }
}

// Scratch layouts (floats).
struct ForwardScratch {
  float *hloc, *dtsum, *h_start;
  ForwardScratch(float* p, int64_t segs, int64_t Di, int64_t N)
      : hloc(p), dtsum(hloc + segs * Di * N), h_start(dtsum + segs * Di) {}
  static int64_t Size(int64_t segs, int64_t Di, int64_t N) { return segs * Di * (2 * N + 1); }
};

struct BackwardScratch {
  float *hloc, *m, *dtsum, *h_start, *carry_in, *dA_part, *dD_part, *dtb_part, *ckpt, *partial;
  BackwardScratch(float* p, int64_t len, int64_t Di, int64_t N, int64_t blocks) {
    const int64_t segs = Segments(len), DiN = Di * N;
    hloc = p, m = hloc + segs * DiN, dtsum = m + segs * DiN, h_start = dtsum + segs * Di;
    carry_in = h_start + segs * DiN, dA_part = carry_in + segs * DiN;
    dD_part = dA_part + segs * DiN, dtb_part = dD_part + segs * Di;
    ckpt = dtb_part + segs * Di, partial = ckpt + (len + kTile - 1) / kTile * DiN;
    (void)blocks;
  }
  static int64_t Size(int64_t len, int64_t Di, int64_t N, int64_t blocks) {
    const int64_t segs = Segments(len), DiN = Di * N;
    return segs * (5 * DiN + 3 * Di) + (len + kTile - 1) / kTile * DiN + blocks * len * 2 * N;
  }
};

// The chunk summary's scratch: the segments' summaries and the combine's per-segment outputs.
struct SummaryScratch {
  float *hloc, *m, *dtsum, *h_start, *carry_in;
  SummaryScratch(float* p, int64_t segs, int64_t Di, int64_t N) {
    const int64_t DiN = Di * N;
    hloc = p, m = hloc + segs * DiN, dtsum = m + segs * DiN, h_start = dtsum + segs * Di;
    carry_in = h_start + segs * DiN;
  }
  static int64_t Size(int64_t segs, int64_t Di, int64_t N) { return segs * Di * (4 * N + 1); }
};

inline int64_t ScanSummaryScratchImpl(int64_t len, int64_t Di, int64_t N) {
  return SummaryScratch::Size(Segments(len), Di, N);
}

inline int64_t ScanForwardScratchImpl(int64_t len, int64_t Di, int64_t N) {
  return ForwardScratch::Size(Segments(len), Di, N);
}

inline int64_t ScanBackwardScratchImpl(int64_t len, int64_t Di, int64_t N) {
  return BackwardScratch::Size(len, Di, N, Blocks(Di, Lanes(N)));
}

// The launch shape of a chunk's scan: L lanes per channel, `blocks` blocks of channels, `segs`
// segments of `rows` rows; grid = (blocks, segs), grid_x = (blocks) for the combine.
struct Geometry {
  int L;
  int64_t blocks, segs, rows;
  dim3 grid, grid_x;
  template <typename S>
  explicit Geometry(const ScanArgs<S>& a)
      : L(Lanes(a.N)),
        blocks(Blocks(a.Di, L)),
        segs(Segments(a.len)),
        rows(SegmentRows(a.len)),
        grid(static_cast<unsigned>(blocks), static_cast<unsigned>(segs)),
        grid_x(static_cast<unsigned>(blocks)) {}
};

template <typename S>
void ScanForwardImpl(cudaStream_t s, const ScanArgs<S>& a, const float* h0, float* h_end, S* o,
                     float* scratch) {
  (void)s;  // used by ADJSH_LAUNCH on the GPU only
  const Geometry g(a);
  ForwardScratch w(scratch, g.segs, a.Di, a.N);
  ADJSH_LAUNCH(SegmentSummaryKernel<S>, g.grid, kThreads, s, a, g.L, g.rows, nullptr, w.hloc,
               nullptr, w.dtsum);
  ADJSH_LAUNCH(SegmentCombineKernel, g.grid_x, kThreads, s, a.Di, a.N, g.L, g.segs, a.A, h0,
               nullptr, w.hloc, nullptr, w.dtsum, w.h_start, h_end, nullptr, nullptr, nullptr);
  if (o) ADJSH_LAUNCH(ScanForwardKernel<S>, g.grid, kThreads, s, a, g.L, g.rows, w.h_start, o);
}

template <typename S>
void ScanSummaryImpl(cudaStream_t s, const ScanArgs<S>& a, const float* d_o, float* h_local,
                     float* m, float* dt_total, float* scratch) {
  (void)s;  // used by ADJSH_LAUNCH on the GPU only
  const Geometry g(a);
  SummaryScratch w(scratch, g.segs, a.Di, a.N);
  ADJSH_LAUNCH(SegmentSummaryKernel<S>, g.grid, kThreads, s, a, g.L, g.rows, d_o, w.hloc,
               d_o ? w.m : nullptr, w.dtsum);
  ADJSH_LAUNCH(SegmentCombineKernel, g.grid_x, kThreads, s, a.Di, a.N, g.L, g.segs, a.A, nullptr,
               nullptr, w.hloc, d_o ? w.m : nullptr, w.dtsum, w.h_start, h_local, w.carry_in,
               d_o ? m : nullptr, dt_total);
}

template <typename S>
void ScanBackwardImpl(cudaStream_t s, const ScanArgs<S>& a, const ScanBackwardArgs<S>& b) {
  (void)s;  // used by ADJSH_LAUNCH on the GPU only
  const Geometry g(a);
  BackwardScratch w(b.scratch, a.len, a.Di, a.N, g.blocks);
  ADJSH_LAUNCH(SegmentSummaryKernel<S>, g.grid, kThreads, s, a, g.L, g.rows, b.d_o, w.hloc, w.m,
               w.dtsum);
  ADJSH_LAUNCH(SegmentCombineKernel, g.grid_x, kThreads, s, a.Di, a.N, g.L, g.segs, a.A, b.h0,
               b.mu, w.hloc, w.m, w.dtsum, w.h_start, nullptr, w.carry_in, nullptr, nullptr);
  ADJSH_LAUNCH(ScanBackwardKernel<S>, g.grid, kThreads, s, a, b, g.L, g.rows, w.h_start,
               w.carry_in, w.ckpt, w.partial, w.dA_part, w.dD_part, w.dtb_part);
  ADJSH_LAUNCH(ReduceBCKernel<S>, dim3(GridFor(a.len * 2 * a.N, kThreads)), kThreads, s,
               w.partial, g.blocks, a.len, a.N, a.R, b.ddbc);
  ADJSH_LAUNCH(ReduceSegmentsKernel, dim3(GridFor(a.Di * a.N, kThreads)), kThreads, s,
               w.dA_part, w.dD_part, w.dtb_part, g.segs, a.Di, a.N, a.A, b.dA_log, b.dD, b.ddt_b);
}

}  // namespace adjsh::cuda::scan_internal

#endif  // ADJSH_KERNELS_CUDA_SCAN_KERNELS_CUH_
