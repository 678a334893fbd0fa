// GemmPacked (kernels/cpu/gemm_packed.h): every element is the fma chain over k, so each kernel
// this CPU has gives, bit for bit, the chain computed here one element at a time, for shapes
// that leave partial tiles and panels (M, N not multiples of the tiles) and for C += A W^T; an
// element's bits depend neither on the product's width nor on its row's place in a tile; and
// the result is the product to f32 accuracy (against a double sum of the same terms). B packed as
// itself (OfProduct) gives the bits of its transpose packed as W. And the same of GemmAtB, the
// weight gradients' product.
#include "kernels/cpu/gemm_packed.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace adjsh::cpu {
namespace {

struct Case {
  int64_t M, N, K;
};

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> v(n);
  for (auto& e : v) e = g(rng);
  return v;
}

// C (+)= A W^T element by element, each the chain of gemm_packed.h.
void Chains(const Case& c, const float* A, int64_t lda, const float* W, bool accumulate,
            float* C, int64_t ldc) {
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t n = 0; n < c.N; ++n) {
      float s = 0;
      for (int64_t k = 0; k < c.K; ++k) s = std::fma(A[m * lda + k], W[n * c.K + k], s);
      C[m * ldc + n] = accumulate ? C[m * ldc + n] + s : s;
    }
}

const Case kCases[] = {{259, 512, 256}, {256, 48, 512}, {37, 33, 17}, {1, 1, 1},
                       {19, 16, 5},     {7, 70, 64},    {24, 31, 0}, {9, 8, 3}};

// For every kernel this CPU has (has(kernel)) and every case, without and with accumulate: the
// operands in = make(c), C0 random, want = the chains from C0 (chains(c, in, accumulate, want)),
// got = the kernel from C0 (run(kernel, c, in, accumulate, got), false if it refused), compared
// byte for byte, so the columns between rows' ends (ldc = N + 5) must be untouched too. The
// scalar kernel at least must run.
template <typename Has, typename Make, typename ChainsOf, typename Run>
void ExpectEveryKernelIsTheChains(const char* product, const Case* cases, size_t n_cases, Has has,
                                  Make make, ChainsOf chains, Run run) {
  int ran = 0;
  for (const char* kernel : {"avx512", "avx2", "scalar"}) {
    if (!has(kernel)) {
      std::printf("no %s %s kernel on this CPU: skipped\n", kernel, product);
      continue;
    }
    ++ran;
    for (size_t i = 0; i < n_cases; ++i)
      for (bool accumulate : {false, true}) {
        const Case& c = cases[i];
        const auto in = make(c);
        const std::vector<float> C0 = Random(c.M * (c.N + 5), 3);
        std::vector<float> want = C0, got = C0;
        chains(c, in, accumulate, want.data());
        ASSERT_TRUE(run(kernel, c, in, accumulate, got.data()));
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << product << " " << kernel << " M=" << c.M << " N=" << c.N << " K=" << c.K
            << " accumulate=" << accumulate;
      }
  }
  EXPECT_GE(ran, 1);
}

TEST(GemmPackedTest, EveryKernelIsTheFmaChainBitForBit) {
  std::printf("GemmPacked runs the %s kernel here\n", GemmPackedKernel());
  using Operands = std::pair<std::vector<float>, std::vector<float>>;  // A, W
  ExpectEveryKernelIsTheChains(
      "GemmPacked", kCases, std::size(kCases),
      [](const char* kernel) {
        float none = 0;
        return GemmPackedWith(kernel, 0, &none, 1, PackedWeights(), false, &none, 1);
      },
      // A with a row stride wider than its rows; W (N, K).
      [](const Case& c) { return Operands{Random(c.M * (c.K + 3), 1), Random(c.N * c.K, 2)}; },
      [](const Case& c, const Operands& in, bool accumulate, float* C) {
        Chains(c, in.first.data(), c.K + 3, in.second.data(), accumulate, C, c.N + 5);
      },
      [](const char* kernel, const Case& c, const Operands& in, bool accumulate, float* C) {
        return GemmPackedWith(kernel, c.M, in.first.data(), c.K + 3,
                              PackedWeights(in.second.data(), c.N, c.K), accumulate, C, c.N + 5);
      });
}

// part ((M - m0), nw), a product of its own, holds full's (M, N) rows m0.. and columns
// n0 .. n0 + nw - 1, bit for bit.
void ExpectPartIsFullsBits(const std::vector<float>& part, const std::vector<float>& full,
                           const Case& c, int64_t m0, int64_t n0, int64_t nw) {
  for (int64_t m = m0; m < c.M; ++m)
    for (int64_t n = 0; n < nw; ++n)
      ASSERT_EQ(std::memcmp(&part[(m - m0) * nw + n], &full[m * c.N + n0 + n], sizeof(float)), 0)
          << m << "," << n0 + n;
}

TEST(GemmPackedTest, AnElementsBitsDependNeitherOnWidthNorOnRowPlace) {
  const Case c{45, 100, 64};
  const std::vector<float> A = Random(c.M * c.K, 4), W = Random(c.N * c.K, 5);
  std::vector<float> full(c.M * c.N);
  GemmPacked(c.M, A.data(), c.K, PackedWeights(W.data(), c.N, c.K), false, full.data(), c.N);
  // Columns 40..69 as a product of their own, rows 13..44 as one of theirs.
  const int64_t n0 = 40, nw = 30, m0 = 13;
  std::vector<float> part((c.M - m0) * nw);
  GemmPacked(c.M - m0, A.data() + m0 * c.K, c.K, PackedWeights(W.data() + n0 * c.K, nw, c.K),
             false, part.data(), nw);
  ExpectPartIsFullsBits(part, full, c, m0, n0, nw);
}

// f32 accuracy: |C - exact| <= K u sum |A W| (the bound of a length-K recursive sum, u = 2^-24).
TEST(GemmPackedTest, IsTheProductToF32Accuracy) {
  const Case c{50, 70, 300};
  const std::vector<float> A = Random(c.M * c.K, 6), W = Random(c.N * c.K, 7);
  std::vector<float> C(c.M * c.N);
  GemmPacked(c.M, A.data(), c.K, PackedWeights(W.data(), c.N, c.K), false, C.data(), c.N);
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t n = 0; n < c.N; ++n) {
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double t = double(A[m * c.K + k]) * W[n * c.K + k];
        exact += t, mag += std::fabs(t);
      }
      ASSERT_LE(std::fabs(C[m * c.N + n] - exact), c.K * std::ldexp(1.0, -24) * mag) << m << "," << n;
    }
}

// A B through OfProduct(B) is A W^T through W = B^T: the same packing, so the same bits.
TEST(GemmPackedTest, OfProductPacksBAsItsTranspose) {
  const Case c{21, 45, 70};
  const std::vector<float> A = Random(c.M * c.K, 8), W = Random(c.N * c.K, 9);
  std::vector<float> B(c.K * c.N);  // W^T, (K, N)
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.K; ++k) B[k * c.N + n] = W[n * c.K + k];
  std::vector<float> want(c.M * c.N), got(c.M * c.N);
  Chains(c, A.data(), c.K, W.data(), false, want.data(), c.N);
  GemmPacked(c.M, A.data(), c.K, PackedWeights::OfProduct(B.data(), c.K, c.N), false, got.data(),
             c.N);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

TEST(GemmPackedTest, UnknownKernelIsRefused) {
  const PackedWeights W;
  float c = 0;
  EXPECT_FALSE(GemmPackedWith("sse9", 1, &c, 1, W, false, &c, 1));
}

// GemmAtB, the weight gradients' C (+)= A^T B: the same chain over k, so the same checks, with
// shapes that leave partial tiles, row blocks and column groups (N below a vector too) and row
// strides wider than the rows. WeightGrad<float> is GemmAtB with accumulate.
// The block's weight gradients at D = 256, chunk 256 (dW_in, dW_out, dW_x, dW_dt), then shapes
// with every kind of edge: rows past a block of 64 (and of 48) and past a tile, a partial column
// group, one column, K = 0.
const Case kAtBCases[] = {{1024, 256, 259}, {256, 512, 256}, {48, 512, 256}, {512, 16, 256},
                       {130, 70, 33},    {37, 33, 17},    {1, 1, 1},      {67, 7, 5},
                       {49, 24, 9},      {24, 31, 0}};

TEST(GemmAtBTest, EveryKernelIsTheFmaChainBitForBit) {
  using Operands = std::pair<std::vector<float>, std::vector<float>>;  // A, B
  ExpectEveryKernelIsTheChains(
      "GemmAtB", kAtBCases, std::size(kAtBCases),
      [](const char* kernel) {
        float none = 0;
        return GemmAtBWith(kernel, 0, 0, 0, &none, 1, &none, 1, false, &none, 1);
      },
      // A (K, M) and B (K, N) with row strides wider than their rows.
      [](const Case& c) {
        return Operands{Random(c.K * (c.M + 3), 1), Random(c.K * (c.N + 2), 2)};
      },
      [](const Case& c, const Operands& in, bool accumulate, float* C) {
        const std::vector<float>&A = in.first, &B = in.second;
        const int64_t lda = c.M + 3, ldb = c.N + 2, ldc = c.N + 5;
        for (int64_t m = 0; m < c.M; ++m)
          for (int64_t n = 0; n < c.N; ++n) {
            float s = 0;
            for (int64_t k = 0; k < c.K; ++k) s = std::fma(A[k * lda + m], B[k * ldb + n], s);
            C[m * ldc + n] = accumulate ? C[m * ldc + n] + s : s;
          }
      },
      [](const char* kernel, const Case& c, const Operands& in, bool accumulate, float* C) {
        return GemmAtBWith(kernel, c.M, c.N, c.K, in.first.data(), c.M + 3, in.second.data(),
                           c.N + 2, accumulate, C, c.N + 5);
      });
}

TEST(GemmAtBTest, AnElementsBitsDependNeitherOnRowsNorOnColumnsAroundIt) {
  const Case c{150, 100, 64};
  const std::vector<float> A = Random(c.K * c.M, 4), B = Random(c.K * c.N, 5);
  std::vector<float> full(c.M * c.N);
  GemmAtB(c.M, c.N, c.K, A.data(), c.M, B.data(), c.N, false, full.data(), c.N);
  // Rows 70..149 and columns 40..69 as a product of their own.
  const int64_t m0 = 70, n0 = 40, nw = 30;
  std::vector<float> part((c.M - m0) * nw);
  GemmAtB(c.M - m0, nw, c.K, A.data() + m0, c.M, B.data() + n0, c.N, false, part.data(), nw);
  ExpectPartIsFullsBits(part, full, c, m0, n0, nw);
}

// f32 accuracy: |C - exact| <= K u sum |A B| (the bound of a length-K recursive sum, u = 2^-24),
// through WeightGrad, which adds to what dW held.
TEST(GemmAtBTest, WeightGradIsTheProductAddedToF32Accuracy) {
  const Case c{70, 50, 300};
  const std::vector<float> A = Random(c.K * c.M, 6), B = Random(c.K * c.N, 7);
  const std::vector<float> W0 = Random(c.M * c.N, 8);
  std::vector<float> W = W0;
  WeightGrad<float>(c.M, c.N, c.K, A.data(), c.M, B.data(), c.N, W.data(), c.N);
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t n = 0; n < c.N; ++n) {
      double exact = W0[m * c.N + n], mag = std::fabs(exact);
      for (int64_t k = 0; k < c.K; ++k) {
        const double t = double(A[k * c.M + m]) * B[k * c.N + n];
        exact += t, mag += std::fabs(t);
      }
      ASSERT_LE(std::fabs(W[m * c.N + n] - exact), (c.K + 1) * std::ldexp(1.0, -24) * mag)
          << m << "," << n;
    }
}

TEST(GemmAtBTest, UnknownKernelIsRefused) {
  float c = 0;
  EXPECT_FALSE(GemmAtBWith("sse9", 1, 1, 1, &c, 1, &c, 1, false, &c, 1));
}

}  // namespace
}  // namespace adjsh::cpu
