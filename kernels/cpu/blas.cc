#include "kernels/cpu/blas.h"

#include <cblas.h>

#include <atomic>
#include <mutex>

namespace adjsh::cpu {
namespace {
CBLAS_TRANSPOSE ToCblas(Trans t) { return t == Trans::kYes ? CblasTrans : CblasNoTrans; }
std::atomic<int64_t> gemm_flops{0};
}  // namespace

int64_t GemmFlopsSoFar() { return gemm_flops.load(std::memory_order_relaxed); }
void CountGemmFlops(int64_t m, int64_t n, int64_t k) {
  gemm_flops.fetch_add(2 * m * n * k, std::memory_order_relaxed);
}

template <>
void Gemm<float>(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  CountGemmFlops(m, n, k);
  InitBlasSingleThreaded();
  cblas_sgemm(CblasRowMajor, ToCblas(ta), ToCblas(tb), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda),
              b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

template <>
void Gemm<double>(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                  double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  CountGemmFlops(m, n, k);
  InitBlasSingleThreaded();
  cblas_dgemm(CblasRowMajor, ToCblas(ta), ToCblas(tb), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda),
              b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void InitBlasSingleThreaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace adjsh::cpu
