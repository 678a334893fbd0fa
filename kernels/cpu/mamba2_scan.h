// The SSM of one Mamba-2 chunk (docs/MATH.md "Mamba-2", "The block form"), per head h of group
// g = h / (H / G) over the chunk's L rows:
//   S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T     (P, N)
//   y_t = S_t C_t + D_h x_t                          (P)
// and its backward. Two forms compute the same function:
//   kPlain   the recurrence, token by token: about 4 P N flops a token and head forward, none
//            of them in a GEMM;
//   kBlocks  the chunked matrix form over blocks of kMamba2ScanBlock rows: inside a block
//            y = (L o C B^T) x + diag(exp c) C S0^T, with L the decay products, and one state
//            update per block, all of it GEMMs (kernels/cpu/blas.h).
// Mamba2ScanFormFor(L) picks the form (the rule and its measurements: docs/BENCHMARKS.md
// "The block form of the scan"). Both round differently, so one chunking always uses one form:
// the choice depends on L alone.
#ifndef ADJSH_KERNELS_CPU_MAMBA2_SCAN_H_
#define ADJSH_KERNELS_CPU_MAMBA2_SCAN_H_

#include <cstdint>

#include "kernels/cpu/mamba2_layer.h"

namespace adjsh {

enum class Mamba2ScanForm { kPlain, kBlocks };

// Rows per block of the block form, and the fewest chunk rows for which it is used.
inline constexpr int64_t kMamba2ScanBlock = 64;
inline constexpr int64_t kMamba2BlocksFrom = 4;

inline Mamba2ScanForm Mamba2ScanFormFor(int64_t L) {
  return L >= kMamba2BlocksFrom ? Mamba2ScanForm::kBlocks : Mamba2ScanForm::kPlain;
}

// One chunk's scan inputs: the rows as Mamba2ChunkActs holds them.
template <typename T>
struct Mamba2ScanRows {
  const Mamba2Dims* d;
  int64_t L;
  const T* dt;     // (L, H): softplus, clamped
  const T* xbc;    // (L, Cc): [x | B | C]
  const T* A;      // (H): -exp(A_log)
  const T* Dskip;  // (H): the skip D_h
};

// S (H, P, N) holds the states before the chunk and is left holding those after its last row;
// y (L, Di) gets the outputs, or with y null only the states are computed.
template <typename T>
void Mamba2ScanForward(Mamba2ScanForm form, const Mamba2ScanRows<T>& r, T* S, T* y);

// After the forward from S0 (H, P, N): dy (L, Di) = dL/dy; carry (H, P, N) = dL/dS after the
// chunk, left as dL/dS0. Accumulates dxbc (L, Cc), ddt (L, H), dA (H) = dL/dA and dD (H).
template <typename T>
void Mamba2ScanBackward(Mamba2ScanForm form, const Mamba2ScanRows<T>& r, const T* S0,
                        const T* dy, T* carry, T* dxbc, T* ddt, T* dA, T* dD);

// The carry alone: dL/dS after the chunk to dL/dS0, affine in it with the decay product as
// its slope.
template <typename T>
void Mamba2ScanAdjoint(Mamba2ScanForm form, const Mamba2ScanRows<T>& r, const T* dy, T* carry);

}  // namespace adjsh

#endif  // ADJSH_KERNELS_CPU_MAMBA2_SCAN_H_
