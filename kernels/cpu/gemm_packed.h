// The projections' GEMMs with a fixed weight, C (M, N) = A (M, K) W^T with W (N, K) row-major (a
// torch Linear's weight): in_proj's halves, x_proj and out_proj of kernels/cpu/mamba_block.cc,
// and dn = dxz W_in of its backward (W^T = W_in). Through OpenBLAS these ran slower inside a
// gradient than on the same shape with warm caches (docs/BENCHMARKS.md): each call packed W
// afresh, and with beta = 0 it first zeroed C and then read it back. Here W is packed once,
// when a layer's block is made, into panels of 32 columns, (K, 32) each, and every C row is
// written once.
//
// Rounding: every element is one chain of fused multiply-adds in k order,
//   s = 0;  s = fma(A[m, k], W[n, k], s) for k = 0 .. K - 1;
//   C[m, n] = s, or C[m, n] + s with accumulate,
// so its bits depend on neither M, N, its place in a tile, nor the instruction set: the AVX-512
// and AVX2 kernels (chosen at run time, so portable builds have them too) and the scalar one
// give the same result (tests/kernels/gemm_packed_test.cc). The cost is the extra copy of these
// weights per process that holds a layer's block (as large as in_proj, x_proj and out_proj).
#ifndef ADJSH_KERNELS_CPU_GEMM_PACKED_H_
#define ADJSH_KERNELS_CPU_GEMM_PACKED_H_

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/blas.h"

namespace adjsh::cpu {

// W (N, K) packed for products A W^T: panel j holds columns n = 32 j .. 32 j + 31 of W^T, as
// (K, 32) rows, the columns past N zero.
class PackedWeights {
 public:
  static constexpr int64_t kPanel = 32;
  PackedWeights() = default;
  PackedWeights(const float* W, int64_t N, int64_t K);
  // B (K, N) row-major packed for products A B (= A W^T with W = B^T).
  static PackedWeights OfProduct(const float* B, int64_t K, int64_t N);
  int64_t N() const { return N_; }
  int64_t K() const { return K_; }
  const float* panel(int64_t j) const { return p_.data() + j * K_ * kPanel; }

 private:
  void Pack(const float* src, int64_t sn, int64_t sk);  // p_ from W's element (n, k) strides
  int64_t N_ = 0, K_ = 0;
  std::vector<float> p_;  // (ceil(N / 32), K, 32)
};

// C (M, N) = A W^T, or C += A W^T with accumulate; A (M, K) with row stride lda, C with ldc.
void GemmPacked(int64_t M, const float* A, int64_t lda, const PackedWeights& W, bool accumulate,
                float* C, int64_t ldc);

// The weight gradients' product C (M, N) = A^T B, or C += A^T B with accumulate: A (K, M) and
// B (K, N) row-major with row strides lda and ldb, C with ldc; K is the chunk's rows, so
// dW = dY^T X sums over tokens. Each element is the chain above over k,
//   s = 0;  s = fma(A[k, m], B[k, n], s) for k = 0 .. K - 1;   C[m, n] = s or C[m, n] + s,
// on the same kernels (the same bits on each). Neither operand is packed: a tile's MR elements
// of A's row k are consecutive, and B's rows, two vectors per k, stay in L2 while a block of
// 64 rows of C passes over them. OpenBLAS packed both operands on every call, and ran the
// block's weight gradients slower than this does (warm caches, one thread; docs/BENCHMARKS.md,
// the kernel table's dw_ rows).
void GemmAtB(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, bool accumulate, float* C, int64_t ldc);
bool GemmAtBWith(const char* kernel, int64_t M, int64_t N, int64_t K, const float* A,
                 int64_t lda, const float* B, int64_t ldb, bool accumulate, float* C,
                 int64_t ldc);

// Which kernel GemmPacked runs on this CPU: "avx512", "avx2" or "scalar".
const char* GemmPackedKernel();
// The kernels by name, for the tests that compare them: false when this CPU lacks one.
bool GemmPackedWith(const char* kernel, int64_t M, const float* A, int64_t lda,
                    const PackedWeights& W, bool accumulate, float* C, int64_t ldc);

// dW (M, N) += A^T B, the weight gradient of a product: GemmAtB in f32; the f64 check mode keeps
// OpenBLAS.
template <typename T>
void WeightGrad(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                T* dW, int64_t ldw) {
  if constexpr (std::is_same_v<T, float>) {
    GemmAtB(M, N, K, A, lda, B, ldb, true, dW, ldw);
  } else {
    Gemm<T>(Trans::kYes, Trans::kNo, M, N, K, 1, A, lda, B, ldb, 1, dW, ldw);
  }
}

// A product C (M, N) = A op(W) with a fixed W, as the block's GEMMs run it: packed in f32; the
// f64 check mode keeps OpenBLAS (it is the exact mode, not the fast one). op(W) = W^T for a
// layer's y = x W^T (W (N, K)), W itself for the backward's dx = dy W (W (K, N)). W must outlive
// it.
template <typename T>
class Projection {
 public:
  Projection(const T* W, Trans op, int64_t N, int64_t K) : W_(W), op_(op), N_(N), K_(K) {
    if constexpr (std::is_same_v<T, float>)
      packed_ = op == Trans::kYes ? PackedWeights(W, N, K) : PackedWeights::OfProduct(W, K, N);
  }
  // C (M, N) = A op(W) (+ C with accumulate).
  void Apply(int64_t M, const T* A, int64_t lda, bool accumulate, T* C, int64_t ldc) const {
    if constexpr (std::is_same_v<T, float>) {
      GemmPacked(M, A, lda, packed_, accumulate, C, ldc);
    } else {
      Gemm<T>(Trans::kNo, op_, M, N_, K_, 1, A, lda, W_, op_ == Trans::kYes ? K_ : N_,
              accumulate ? 1 : 0, C, ldc);
    }
  }

 private:
  const T* W_;
  Trans op_;
  int64_t N_, K_;
  PackedWeights packed_;  // f32 only
};

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_GEMM_PACKED_H_
