// The selective scan of one Mamba layer over one chunk, all Di channels, blocked V channels at a
// time (V = simd::kWidth<T>: 8 for f32, 4 for f64). The equations are those of scan.h; what
// changes is the loop order. scan.h walks one channel's N lanes token after token, so every token
// ends in a sum over N across a vector (a shuffle chain on the recurrence's critical path) and
// reads its Delta and x' with a stride of Di. Here lane c of a vector is channel i0 + c: a row's
// V channels are one contiguous load, each state lane n of the block is one vector whose V lanes
// are V independent recurrences, and the sums over n (y, and the VJP sums s_a, s_b) are lane-wise
// accumulations with no shuffle at all. Only dB and dC, sums over channels, cross lanes: once per
// token and block, through simd.h's fixed pairwise tree.
//
// Rounding against scan.h: in f32 the decays a_t = exp(Delta_t A) come from Exp2Fast
// (kernels/cpu/math.h: 2^(Delta (A log2 e)), 12 operations against ExpFast's 16, both about
// 2 ulp), so every output moves by f32 rounding; in f64 the decays are libm's exp as in scan.h,
// and the states h_t, the end states, the adjoint summaries and dD are bitwise scan.h's (same
// expressions, lane by lane), while the backward's lambda_t = ybar_t C_t + a_{t+1} . lambda_{t+1}
// rounds as the adjoint summary's carry (one fused multiply-add fewer per state than scan.h's
// form), and y, dDelta, dx', dA, dB and dC are sums in another order. The order depends on Di and V
// only, never on addresses, threads or the instruction set (docs/MATH.md, "Rounding of the CPU
// scan").
//
// Where AVX-512 is, two blocks share a 512-bit vector (simd::F32x8x2) with the same bits.
// The truncated adjoint (window > 0) runs scan.h's per-channel kernel.
#ifndef ADJSH_KERNELS_CPU_SCAN_BLOCK_H_
#define ADJSH_KERNELS_CPU_SCAN_BLOCK_H_

#include <cstdint>

#include "kernels/cpu/scan.h"

namespace adjsh::cpu {

// Forward over rows [0, rows) of every channel from h0 (Di, N; nullptr = zeros). Writes h_end
// (Di, N) and, if y is non-null, y (rows, Di). d_skip (Di).
template <typename T>
void ScanForward(const ScanInputs<T>& in, int64_t rows, const T* h0, const T* d_skip, T* h_end,
                 T* y);

// The chunk's adjoint summary m (Di, N) = a_0 . lambda_local_0 from the local reverse scan over
// rows [0, len) from zero, ybar (M, Di).
template <typename T>
void ScanAdjointSummary(const ScanInputs<T>& in, int64_t len, const T* ybar, T* m);

// ScanBackwardChannel (scan.h) for every channel: h0 and mu (Di, N) or nullptr; d_skip (Di).
template <typename T>
void ScanBackward(const ScanInputs<T>& in, const ScanBackwardOptions& opt, const T* h0, const T* mu,
                  const T* ybar, const T* d_skip, const ScanGrads<T>& out);

// The same three on simd::Lanes, the portable vectors: what a build without AVX2 runs, and what
// the native kernels must equal bit for bit (tests/kernels/scan_block_test.cc).
template <typename T>
void ScanForwardPortable(const ScanInputs<T>& in, int64_t rows, const T* h0, const T* d_skip,
                         T* h_end, T* y);
template <typename T>
void ScanAdjointSummaryPortable(const ScanInputs<T>& in, int64_t len, const T* ybar, T* m);
template <typename T>
void ScanBackwardPortable(const ScanInputs<T>& in, const ScanBackwardOptions& opt, const T* h0,
                          const T* mu, const T* ybar, const T* d_skip, const ScanGrads<T>& out);

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_SCAN_BLOCK_H_
