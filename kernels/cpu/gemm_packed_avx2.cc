// GemmPacked's AVX2 kernel (gemm_packed_impl.h): 8-lane vectors, tiles of 6 rows by 16 columns
// (12 accumulators, 2 panel loads and a broadcast: 15 of the 16 registers), or 12 rows by 8.
// Compiled with -mavx2 -mfma alone (kernels/CMakeLists.txt); run only where the CPU has them
// (gemm_packed.cc).
#include <immintrin.h>

#include "kernels/cpu/gemm_packed_impl.h"

namespace adjsh::cpu {
namespace {

struct V256 {
  using Reg = __m256;
  static constexpr int64_t kLanes = 8;
  static Reg Zero() { return _mm256_setzero_ps(); }
  static Reg Load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg Broadcast(float x) { return _mm256_set1_ps(x); }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg Add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static void Store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static __m256i First(int64_t w) {  // lanes [0, w) set
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Reg LoadFirst(const float* p, int64_t w) { return _mm256_maskload_ps(p, First(w)); }
  static void StoreFirst(float* p, Reg v, int64_t w) { _mm256_maskstore_ps(p, First(w), v); }
};

}  // namespace

void GemmPackedAvx2(int64_t M, const float* A, int64_t lda, const PackedWeights& W,
                    bool accumulate, float* C, int64_t ldc) {
  Run<V256, 6, 12>(M, A, lda, W, accumulate, C, ldc);
}

void GemmAtBAvx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                 int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  RunAtB<V256, 6, 12, 48>(M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}

}  // namespace adjsh::cpu
