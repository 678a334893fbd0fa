// Packing, the scalar kernel, and the choice of kernel for GemmPacked (gemm_packed.h).
#include "kernels/cpu/gemm_packed.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"

namespace adjsh::cpu {

#ifdef ADJSH_GEMM_X86  // gemm_packed_avx512.cc and gemm_packed_avx2.cc, x86-64 only
void GemmPackedAvx512(int64_t M, const float* A, int64_t lda, const PackedWeights& W,
                      bool accumulate, float* C, int64_t ldc);
void GemmPackedAvx2(int64_t M, const float* A, int64_t lda, const PackedWeights& W,
                    bool accumulate, float* C, int64_t ldc);
void GemmAtBAvx512(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                   int64_t ldb, bool accumulate, float* C, int64_t ldc);
void GemmAtBAvx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                 int64_t ldb, bool accumulate, float* C, int64_t ldc);
#endif

namespace {

using Kernel = void (*)(int64_t, const float*, int64_t, const PackedWeights&, bool, float*,
                        int64_t);
using AtBKernel = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                           int64_t, bool, float*, int64_t);

// The chains of gemm_packed.h one panel row at a time, with std::fma: the same bits as the
// vector kernels (one rounding per step), at scalar speed. For CPUs with neither kernel's
// instructions, and the tests.
void GemmPackedScalar(int64_t M, const float* A, int64_t lda, const PackedWeights& W,
                      bool accumulate, float* C, int64_t ldc) {
  constexpr int64_t P = PackedWeights::kPanel;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j * P < W.N(); ++j) {
      float s[P] = {};
      const float* wp = W.panel(j);
      for (int64_t k = 0; k < W.K(); ++k) {
        const float a = A[m * lda + k];
        for (int64_t c = 0; c < P; ++c) s[c] = std::fma(a, wp[k * P + c], s[c]);
      }
      float* row = C + m * ldc + j * P;
      const int64_t w = std::min(P, W.N() - j * P);
      for (int64_t c = 0; c < w; ++c) row[c] = accumulate ? row[c] + s[c] : s[c];
    }
}

// GemmAtB's chains, element by element.
void GemmAtBScalar(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                   int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s = std::fma(A[k * lda + m], B[k * ldb + n], s);
      C[m * ldc + n] = accumulate ? C[m * ldc + n] + s : s;
    }
}

struct Named {
  const char* name;
  Kernel run;
  AtBKernel run_atb;
  bool here;  // this CPU has the instructions
  // The product; an empty one touches nothing.
  void Run(int64_t M, const float* A, int64_t lda, const PackedWeights& W, bool accumulate,
           float* C, int64_t ldc) const {
    if (M > 0 && W.N() > 0) run(M, A, lda, W, accumulate, C, ldc);
  }
  void RunAtB(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
              int64_t ldb, bool accumulate, float* C, int64_t ldc) const {
    if (M > 0 && N > 0) run_atb(M, N, K, A, lda, B, ldb, accumulate, C, ldc);
  }
};

// The kernels, fastest first.
const Named* Kernels() {
  static const Named kAll[] = {
#ifdef ADJSH_GEMM_X86
      {"avx512", GemmPackedAvx512, GemmAtBAvx512,
       static_cast<bool>(__builtin_cpu_supports("avx512f"))},
      {"avx2", GemmPackedAvx2, GemmAtBAvx2,
       __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
#endif
      {"scalar", GemmPackedScalar, GemmAtBScalar, true},
      {nullptr, nullptr, nullptr, false},
  };
  return kAll;
}

const Named& Chosen() {
  static const Named* chosen = [] {
    const Named* k = Kernels();
    while (!k->here) ++k;
    return k;
  }();
  return *chosen;
}

}  // namespace

// Element (n, k) of W is src[n * sn + k * sk]: sn = K, sk = 1 for W itself, sn = 1, sk = N for
// its transpose B. Panels are written in order, row by row.
void PackedWeights::Pack(const float* src, int64_t sn, int64_t sk) {
  ADJSH_CHECK(N_ >= 0 && K_ >= 0, "PackedWeights: negative shape");
  const int64_t panels = (N_ + kPanel - 1) / kPanel;
  p_.assign(panels * K_ * kPanel, 0.0f);
  for (int64_t j = 0; j < panels; ++j) {
    const int64_t n0 = j * kPanel, width = std::min(kPanel, N_ - n0);
    for (int64_t k = 0; k < K_; ++k) {
      float* dst = p_.data() + (j * K_ + k) * kPanel;
      for (int64_t c = 0; c < width; ++c) dst[c] = src[(n0 + c) * sn + k * sk];
    }
  }
}

PackedWeights::PackedWeights(const float* W, int64_t N, int64_t K) : N_(N), K_(K) {
  Pack(W, K, 1);
}

PackedWeights PackedWeights::OfProduct(const float* B, int64_t K, int64_t N) {
  PackedWeights w;
  w.N_ = N, w.K_ = K;
  w.Pack(B, 1, N);
  return w;
}

void GemmPacked(int64_t M, const float* A, int64_t lda, const PackedWeights& W, bool accumulate,
                float* C, int64_t ldc) {
  CountGemmFlops(M, W.N(), W.K());
  Chosen().Run(M, A, lda, W, accumulate, C, ldc);
}

const char* GemmPackedKernel() { return Chosen().name; }

namespace {
// The kernel of that name if this CPU has it, else null.
const Named* Here(const char* kernel) {
  for (const Named* k = Kernels(); k->name; ++k)
    if (std::strcmp(k->name, kernel) == 0) return k->here ? k : nullptr;
  return nullptr;
}
}  // namespace

bool GemmPackedWith(const char* kernel, int64_t M, const float* A, int64_t lda,
                    const PackedWeights& W, bool accumulate, float* C, int64_t ldc) {
  const Named* k = Here(kernel);
  if (k) k->Run(M, A, lda, W, accumulate, C, ldc);
  return k != nullptr;
}

void GemmAtB(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  CountGemmFlops(M, N, K);
  Chosen().RunAtB(M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}

bool GemmAtBWith(const char* kernel, int64_t M, int64_t N, int64_t K, const float* A,
                 int64_t lda, const float* B, int64_t ldb, bool accumulate, float* C,
                 int64_t ldc) {
  const Named* k = Here(kernel);
  if (k) k->RunAtB(M, N, K, A, lda, B, ldb, accumulate, C, ldc);
  return k != nullptr;
}

}  // namespace adjsh::cpu
