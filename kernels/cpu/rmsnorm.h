// RMSNorm over rows of width D: n = u * r * w, r = 1 / sqrt(mean(u^2) + eps).
#ifndef ADJSH_KERNELS_CPU_RMSNORM_H_
#define ADJSH_KERNELS_CPU_RMSNORM_H_

#include <cmath>
#include <cstdint>

#include "kernels/cpu/math.h"

namespace adjsh::cpu {

// Every function here has internal linkage (static): each file that includes this header gets
// its own copy, compiled with that file's flags. The CPU kernels compile with -march=native and
// -ffp-contract=off (kernels/CMakeLists.txt) and other files without, so one shared (weak)
// copy would make a kernel's bits depend on which copy the linker kept: a block's
// LocalSummary and its Forward once differed in their last bits for that reason
// (tests/kernels/mamba_block_test.cc).

// sum_d a[d] b[d] (with w: sum_d (a[d] w[d]) b[d]) over a row of D, as 8 lane-wise partial
// sums (element d in lane d mod 8, each lane in order) joined by the pairwise tree of
// kernels/cpu/simd.h: the compiler vectorises it without reassociating anything, and the order
// is fixed by D alone. (A plain running sum is one dependent chain of D adds, which could not
// be vectorised.)
template <typename T>
static T RowDot(const T* a, const T* b, int64_t D, const T* w = nullptr) {
  T acc[8] = {};
  const int64_t full = D / 8 * 8;
  auto f = [&](int64_t d) { return w ? a[d] * w[d] : a[d]; };
  for (int64_t d = 0; d < full; d += 8)
    for (int c = 0; c < 8; ++c) acc[c] = MulAdd(f(d + c), b[d + c], acc[c]);
  for (int64_t d = full; d < D; ++d) acc[d - full] = MulAdd(f(d), b[d], acc[d - full]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// n (rows, D) = u * r * w given r (rows): RmsNormForward's n, the same bits from its r.
template <typename T>
static void RmsNormApply(const T* u, int64_t rows, int64_t D, const T* w, const T* r, T* n) {
  for (int64_t t = 0; t < rows; ++t) {
    const T *ut = u + t * D, rt = r[t];
    T* nt = n + t * D;
    for (int64_t d = 0; d < D; ++d) nt[d] = ut[d] * rt * w[d];
  }
}

// u, n: (rows, D); w: (D); r: (rows) written.
template <typename T>
static void RmsNormForward(const T* u, int64_t rows, int64_t D, const T* w, double eps, T* n,
                           T* r) {
  for (int64_t t = 0; t < rows; ++t) {
    const T* ut = u + t * D;
    const T ss = RowDot(ut, ut, D);
    r[t] = T(1) / std::sqrt(ss / T(D) + T(eps));
  }
  RmsNormApply(u, rows, D, w, r, n);
}

// Given dn = dL/dn (rows, D): dw (D) += sum_t dn . u r;  du (rows, D) = r v - u r^3 (v . u) / D
// with v = dn . w. du is written (it may alias dn).
template <typename T>
static void RmsNormBackward(const T* u, int64_t rows, int64_t D, const T* w, const T* r,
                            const T* dn, T* dw, T* du) {
  for (int64_t t = 0; t < rows; ++t) {
    const T* ut = u + t * D;
    const T* gt = dn + t * D;
    const T rt = r[t];
    for (int64_t d = 0; d < D; ++d) dw[d] += gt[d] * ut[d] * rt;
    const T dot = RowDot(gt, ut, D, w);  // (dn . w) . u
    const T coef = rt * rt * rt * dot / T(D);
    T* dut = du + t * D;
    for (int64_t d = 0; d < D; ++d) dut[d] = rt * gt[d] * w[d] - ut[d] * coef;
  }
}

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_RMSNORM_H_
