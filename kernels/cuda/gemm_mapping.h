// A row-major GEMM as one column-major (cuBLAS) call. Row-major X (r, c) with row stride ld is
// column-major X^T with leading dimension ld, so C = op(A) op(B) (row-major, C (m, n)) is
// C^T = op(B)^T op(A)^T column-major: the operands swap, m and n swap, the ops stay.
// Shared by context.cu (cuBLAS) and the host emulation test (a column-major reference GEMM), so
// that the mapping itself is tested without a GPU.
#ifndef ADJSH_KERNELS_CUDA_GEMM_MAPPING_H_
#define ADJSH_KERNELS_CUDA_GEMM_MAPPING_H_

#include <cublas_api.h>

#include <cstdint>

namespace adjsh::cuda {

// col(op_a, op_b, m, n, k, alpha, A, A_type, lda, B, B_type, ldb, beta, C, C_type, ldc):
// column-major C (m, n) = alpha op_a(A) op_b(B) + beta C, as cublasGemmEx_64 takes them.
template <typename ColumnMajorGemm>
void RowMajorGemm(ColumnMajorGemm&& col, bool trans_a, bool trans_b, int64_t m, int64_t n,
                  int64_t k, float alpha, const void* a, cudaDataType_t a_type, int64_t lda,
                  const void* b, cudaDataType_t b_type, int64_t ldb, float beta, void* c,
                  cudaDataType_t c_type, int64_t ldc) {
  if (m == 0 || n == 0) return;
  col(trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha,
      b, b_type, ldb, a, a_type, lda, &beta, c, c_type, ldc);
}

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_GEMM_MAPPING_H_
