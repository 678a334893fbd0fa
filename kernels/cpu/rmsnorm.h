// RMSNorm over rows of width D: n = u * r * w, r = 1 / sqrt(mean(u^2) + eps).
#ifndef ADJSH_KERNELS_CPU_RMSNORM_H_
#define ADJSH_KERNELS_CPU_RMSNORM_H_

#include <cmath>
#include <cstdint>

namespace adjsh::cpu {

// u, n: (rows, D); w: (D); r: (rows) written.
template <typename T>
void RmsNormForward(const T* u, int64_t rows, int64_t D, const T* w, double eps, T* n, T* r) {
  for (int64_t t = 0; t < rows; ++t) {
    const T* ut = u + t * D;
    T ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += ut[d] * ut[d];
    const T rt = T(1) / std::sqrt(ss / T(D) + T(eps));
    r[t] = rt;
    T* nt = n + t * D;
    for (int64_t d = 0; d < D; ++d) nt[d] = ut[d] * rt * w[d];
  }
}

// Given dn = dL/dn (rows, D): dw (D) += sum_t dn . u r;  du (rows, D) = r v - u r^3 (v . u) / D
// with v = dn . w. du is written (it may alias dn).
template <typename T>
void RmsNormBackward(const T* u, int64_t rows, int64_t D, const T* w, const T* r, const T* dn,
                     T* dw, T* du) {
  for (int64_t t = 0; t < rows; ++t) {
    const T* ut = u + t * D;
    const T* gt = dn + t * D;
    const T rt = r[t];
    T dot = 0;
    for (int64_t d = 0; d < D; ++d) {
      dw[d] += gt[d] * ut[d] * rt;
      dot += gt[d] * w[d] * ut[d];
    }
    const T coef = rt * rt * rt * dot / T(D);
    T* dut = du + t * D;
    for (int64_t d = 0; d < D; ++d) dut[d] = rt * gt[d] * w[d] - ut[d] * coef;
  }
}

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_RMSNORM_H_
