// The scan's decays and the exact combine of two stretches of tokens (docs/MATH.md "Chunks",
// "Spans"), shared by Mamba-1's chunk ops (kernels/mamba_chunk_ops.cc), the in-process chunk
// schedules (engine/gradient_step.cc) and the span ledger (engine/span_ledger.cc).
#ifndef ADJSH_KERNELS_DECAY_H_
#define ADJSH_KERNELS_DECAY_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/model.h"

namespace adjsh {

// A = -exp(A_log) of every layer: K x (Di, N), layer k at k Di N.
template <typename T>
std::vector<T> DecayRates(const ModelParams<T>& params) {
  const int64_t DiN = params.config.inner() * params.config.state_size;
  std::vector<T> A(params.layers.size() * DiN);
  for (size_t k = 0; k < params.layers.size(); ++k)
    for (int64_t q = 0; q < DiN; ++q) A[k * DiN + q] = -std::exp(params.layers[k].A_log[q]);
  return A;
}

// out = exp(A S) . v + add per (i, n), with S (Di) the delta sums of a stretch of tokens and
// A, v, add, out (Di, N): a state carried across the stretch (or an adjoint carried back) plus
// what the stretch adds itself. out may not alias v or add.
template <typename T>
void DecayAdd(const T* A, const T* S, const T* v, const T* add, int64_t DiN, int64_t N, T* out) {
  for (int64_t q = 0; q < DiN; ++q) out[q] = std::exp(A[q] * S[q / N]) * v[q] + add[q];
}

}  // namespace adjsh

#endif  // ADJSH_KERNELS_DECAY_H_
