// The vector kernel of GemmPacked (gemm_packed.h), templated on V, the instruction set's vector
// of floats (V512 in gemm_packed_avx512.cc, V256 in gemm_packed_avx2.cc). Each of those files is
// compiled for its instruction set alone, so everything here has internal linkage: no function
// compiled with AVX-512 may be the one the linker keeps for code that runs without it.
//
// A tile is MR rows of C by NV vectors of columns: MR * NV accumulators in registers, each the
// fma chain over k of gemm_packed.h, fed per k by NV loads of the packed panel row and MR
// broadcasts of A. Rows left over from the full tiles run in tiles of 8, 4, 2 and 1 rows: the
// chain of an element is the same in every tile, so are its bits.
#ifndef ADJSH_KERNELS_CPU_GEMM_PACKED_IMPL_H_
#define ADJSH_KERNELS_CPU_GEMM_PACKED_IMPL_H_

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/gemm_packed.h"

namespace adjsh::cpu {
namespace {

constexpr int64_t kPanel = PackedWeights::kPanel;

// C[0 .. w) (+)= v, for the w <= L columns of a vector that lie inside C.
template <class V>
inline void StoreCols(float* C, typename V::Reg v, int64_t w, bool accumulate) {
  if (w >= V::kLanes) {
    if (accumulate) v = V::Add(V::Load(C), v);
    V::Store(C, v);
  } else {
    if (accumulate) v = V::Add(V::LoadFirst(C, w), v);
    V::StoreFirst(C, v, w);
  }
}

// Rows [0, MR) of C's columns [0, width) from the rows of B at wp (already offset to this tile's
// first column), ldw apart: a packed panel's (K, 32) rows (ldw = kPanel), or with kAtB a
// row-major B read in place. A is row-major (M, K), or with kAtB the transpose of a row-major
// (K, M) array: the tile's MR elements of each k are then consecutive. kMaskB: B's last vector
// lies partly past the product's width (an unpacked B has no zero columns there).
template <class V, int MR, int NV, bool kAtB = false, bool kMaskB = false>
inline void Tile(const float* A, int64_t lda, const float* wp, int64_t ldw, int64_t K, float* C,
                 int64_t ldc, int64_t width, bool accumulate) {
  using R = typename V::Reg;
  R c[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) c[r][v] = V::Zero();
  // The tile's lines of C, fetched for writing now so that their misses overlap the K loop:
  // inside a gradient a product's C is cold (a fresh activation, or the residual), and the
  // stores at the tile's end waited on them. kernel_bench's cold-cache rate of in_proj's half,
  // whose C rows are 4 KiB apart, rose with this fetch; the warm rate did not move
  // (docs/BENCHMARKS.md).
  // Only the lines the stores below reach: a vector past the product's width has none here,
  // and its address may be another row's or another array's.
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      if (width - v * V::kLanes > 0) __builtin_prefetch(C + r * ldc + v * V::kLanes, 1, 3);
  for (int64_t k = 0; k < K; ++k) {
    R b[NV];
    for (int v = 0; v < NV; ++v) {
      const float* q = wp + k * ldw + v * V::kLanes;
      if constexpr (kMaskB) {
        const int64_t w = width - v * V::kLanes;
        b[v] = w >= V::kLanes ? V::Load(q) : V::LoadFirst(q, w);
      } else {
        b[v] = V::Load(q);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const R a = V::Broadcast(kAtB ? A[k * lda + r] : A[r * lda + k]);
      for (int v = 0; v < NV; ++v) c[r][v] = V::Fma(a, b[v], c[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      const int64_t w = width - v * V::kLanes;
      if (w > 0) StoreCols<V>(C + r * ldc + v * V::kLanes, c[r][v], w, accumulate);
    }
}

// All M rows of one column group: full tiles of MR rows, then tiles of 8, 4, 2, 1. A tile's A
// starts at row m of A, or with kAtB at its column m.
template <class V, int MR, int NV, bool kAtB = false, bool kMaskB = false>
inline void Rows(int64_t M, const float* A, int64_t lda, const float* wp, int64_t ldw, int64_t K,
                 float* C, int64_t ldc, int64_t width, bool accumulate) {
  auto tile = [&](auto rows, int64_t m) {
    constexpr int kR = decltype(rows)::value;
    Tile<V, kR, NV, kAtB, kMaskB>(kAtB ? A + m : A + m * lda, lda, wp, ldw, K, C + m * ldc, ldc,
                                  width, accumulate);
  };
  int64_t m = 0;
  for (; m + MR <= M; m += MR) tile(std::integral_constant<int, MR>{}, m);
  if constexpr (MR > 8)
    if (m + 8 <= M) tile(std::integral_constant<int, 8>{}, m), m += 8;
  if (m + 4 <= M) tile(std::integral_constant<int, 4>{}, m), m += 4;
  if (m + 2 <= M) tile(std::integral_constant<int, 2>{}, m), m += 2;
  if (m < M) tile(std::integral_constant<int, 1>{}, m);
}

// The whole product: panel by panel (a panel, (K, 32), stays in L2 while all rows of A pass),
// each panel in column groups of two vectors (one group with 16-lane vectors, two with 8).
// kMR2, kMR1: the tile rows for groups of two vectors and of one.
template <class V, int kMR2, int kMR1>
void Run(int64_t M, const float* A, int64_t lda, const PackedWeights& W, bool accumulate,
         float* C, int64_t ldc) {
  constexpr int64_t G = 2 * V::kLanes;
  for (int64_t j = 0; j * kPanel < W.N(); ++j) {
    const int64_t n0 = j * kPanel;
    const int64_t width = W.N() - n0 < kPanel ? W.N() - n0 : kPanel;
    for (int64_t g0 = 0; g0 < width; g0 += G) {
      const int64_t w = width - g0 < G ? width - g0 : G;
      const float* wp = W.panel(j) + g0;
      float* c = C + n0 + g0;
      if (w > V::kLanes) {
        Rows<V, kMR2, 2>(M, A, lda, wp, kPanel, W.K(), c, ldc, w, accumulate);
      } else {
        Rows<V, kMR1, 1>(M, A, lda, wp, kPanel, W.K(), c, ldc, w, accumulate);
      }
    }
  }
}

// GemmAtB (gemm_packed.h): blocks of kBlock rows of C (kBlock columns of A, K by kBlock floats,
// 64 KiB at K = 256 and kBlock = 64: in L2 while every column group of B passes), column groups
// of two vectors, then one, then the masked rest.
template <class V, int kMR2, int kMR1, int64_t kBlock>
void RunAtB(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
            int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  constexpr int64_t L = V::kLanes, G = 2 * L;
  for (int64_t m0 = 0; m0 < M; m0 += kBlock) {
    const int64_t rows = M - m0 < kBlock ? M - m0 : kBlock;
    for (int64_t n0 = 0; n0 < N; n0 += G) {
      const int64_t w = N - n0 < G ? N - n0 : G;
      const float* a = A + m0;
      const float* b = B + n0;
      float* c = C + m0 * ldc + n0;
      if (w == G) {
        Rows<V, kMR2, 2, true>(rows, a, lda, b, ldb, K, c, ldc, w, accumulate);
      } else if (w > L) {
        Rows<V, kMR2, 2, true, true>(rows, a, lda, b, ldb, K, c, ldc, w, accumulate);
      } else if (w == L) {
        Rows<V, kMR1, 1, true>(rows, a, lda, b, ldb, K, c, ldc, w, accumulate);
      } else {
        Rows<V, kMR1, 1, true, true>(rows, a, lda, b, ldb, K, c, ldc, w, accumulate);
      }
    }
  }
}

}  // namespace
}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_GEMM_PACKED_IMPL_H_
