// GemmPacked's AVX-512 kernel (gemm_packed_impl.h): 16-lane vectors, tiles of 8 rows by 32
// columns (16 accumulators of the 32 registers), or 16 rows by 16 for a panel's last 16 or fewer
// columns. Compiled with -mavx512f -mfma alone (kernels/CMakeLists.txt); run only where the CPU
// has them (gemm_packed.cc).
#include <immintrin.h>

#include "kernels/cpu/gemm_packed_impl.h"

namespace adjsh::cpu {
namespace {

struct V512 {
  using Reg = __m512;
  static constexpr int64_t kLanes = 16;
  static Reg Zero() { return _mm512_setzero_ps(); }
  static Reg Load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg Broadcast(float x) { return _mm512_set1_ps(x); }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg Add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static void Store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static __mmask16 First(int64_t w) { return static_cast<__mmask16>((1u << w) - 1); }
  static Reg LoadFirst(const float* p, int64_t w) { return _mm512_maskz_loadu_ps(First(w), p); }
  static void StoreFirst(float* p, Reg v, int64_t w) { _mm512_mask_storeu_ps(p, First(w), v); }
};

}  // namespace

void GemmPackedAvx512(int64_t M, const float* A, int64_t lda, const PackedWeights& W,
                      bool accumulate, float* C, int64_t ldc) {
  Run<V512, 8, 16>(M, A, lda, W, accumulate, C, ldc);
}

void GemmAtBAvx512(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                   int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  RunAtB<V512, 8, 16, 64>(M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}

}  // namespace adjsh::cpu
