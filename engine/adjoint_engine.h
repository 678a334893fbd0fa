// The adjoint engine: loss and exact gradient of the mean next-token loss of one sequence,
// computed by adjoint sharding in-process (DESIGN.md §3).
//
//   forward   for each layer k: pass F1 (chunks in parallel: local state summaries), an exact
//             O(chunks Di N) combine of the chunk-boundary states, pass F2 (chunks in parallel:
//             the layer output); the layer inputs u^k and chunk-boundary states are kept.
//   head      blocks of rows in parallel: final norm, tied LM head, cross-entropy and dL/du^{K+1}.
//   backward  for k = K..1: pass A (chunks in parallel: adjoint summaries m_c, S_c), the reverse
//             combine mu_{c-1} = m_c + exp(A S_c) . mu_c, pass B (chunks in parallel: the VJPs);
//             with a truncated window, pass B alone (each chunk reads its lookahead).
// Task partials are added in task order, so the result does not depend on the thread count.
// Memory: K T D layer inputs + 2 T D adjoint buffers + K (T / C) Di N states, plus per-task
// scratch bounded by the chunk size.
#ifndef ADJSH_ENGINE_ADJOINT_ENGINE_H_
#define ADJSH_ENGINE_ADJOINT_ENGINE_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/model.h"

namespace adjsh {

struct GradOptions {
  int64_t chunk = 256;  // C: tokens per (layer, chunk) task
  int64_t window = 0;   // Wt: 0 = exact adjoint; else truncated to Wt tokens (Wt >= T is exact)
  int threads = 0;      // 0: one per hardware thread
  // Progress: called from the calling thread between phases with (phase, done, total).
  std::function<void(std::string_view, int64_t, int64_t)> progress;
};

template <typename T>
struct GradResult {
  double loss = 0;
  ModelParams<T> grad;
  int64_t stored_bytes = 0;  // layer inputs, adjoint buffers and chunk states held at the peak
};

// INVALID_ARGUMENT for fewer than 2 tokens, token ids >= V, chunk < 1 or window < 0.
template <typename T>
absl::StatusOr<GradResult<T>> ComputeGradient(const ModelParams<T>& params,
                                              std::span<const uint32_t> tokens,
                                              const GradOptions& options);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_ADJOINT_ENGINE_H_
