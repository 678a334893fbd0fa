// Row-major GEMM through OpenBLAS: C (M, N) = alpha op(A) op(B) + beta C, with op(A) (M, K) and
// op(B) (K, N). Leading dimensions are row strides. OpenBLAS runs single-threaded inside adjsh:
// the engine parallelises over tasks, and one thread per GEMM keeps results independent of the
// thread count.
#ifndef ADJSH_KERNELS_CPU_BLAS_H_
#define ADJSH_KERNELS_CPU_BLAS_H_

#include <cstdint>

namespace adjsh::cpu {

enum class Trans { kNo, kYes };

template <typename T>
void Gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// Floating-point operations (2 m n k per product) of the GEMMs this process ran through Gemm,
// GemmPacked and GemmAtB (gemm_packed.h), all threads together: what bench/flops.h's counts of
// a gradient are checked against (tests/kernels/gemm_flops_test.cc). One relaxed atomic add per
// call, which covers a chunk's whole product.
int64_t GemmFlopsSoFar();
void CountGemmFlops(int64_t m, int64_t n, int64_t k);

// Pins OpenBLAS to one thread per call (see above). Idempotent; Gemm calls it first, so every
// process that computes (the coordinator and each worker alike) rounds the same way.
void InitBlasSingleThreaded();

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_BLAS_H_
