// The adjoint engine: loss and exact gradient of the mean next-token loss of one sequence,
// computed by adjoint sharding in-process (docs/MATH.md "Chunks" and "Spans"). Its options are
// engine/grad_options.h.
//
// Three schedules (every one adds its partials in a fixed order, so none depends on the thread
// count; they round differently from one another):
//   spans (default)  the step cut into S spans of whole chunks, four (layer, span) tasks per
//             layer: summaries, combines across spans, spans from their true state
//             (engine/span_plan.h). Workers run exactly this schedule, so in-process and any
//             number of workers give the same bits. Up to S tasks run at once.
//   wavefront forward task (k, c) runs once (k-1, c) and (k, c-1) are done, taking
//             its initial state from (k, c-1); backward task (k, c) once (k+1, c) and (k, c+1)
//             are done, taking the adjoint mu from (k, c+1). Each chunk's forward runs once and
//             carries its activations to its backward task (as the kept budget allows:
//             kernels/cpu/kept_pool.h), which then skips its recompute; the head runs chunk by
//             chunk beside the forward's last tasks, all one task graph (with C a multiple
//             of 256, its first chunk is C / 4 rows and its last C / 4 to C / 4 + 63:
//             GradientStep::ChunkStarts);
//             up to min(K, chunks)
//             tasks run at once (and a head task beside them). dL/du^k replaces dL/du^{k+1} chunk by chunk in one (T, D)
//             buffer, and each mu is kept only until the task that consumes it has run.
//   two-pass  for each layer: pass one (chunks in parallel: local state summaries, or adjoint
//             summaries m_c and S_c), an exact O(chunks Di N) combine
//             (h0(c+1) = exp(A S_c) . h0(c) + h_local(c); mu_{c-1} = m_c + exp(A S_c) . mu_c),
//             pass two (chunks in parallel: outputs, or VJPs).
//   head      blocks of rows: final norm, tied LM head, cross-entropy and dL/du^{K+1}.
// With a truncated window the backward is always layer by layer with no pass one (each chunk
// reads its lookahead rows). Partials are added in a fixed order, so the result does not depend
// on the thread count (the two schedules round differently).
// Memory: K T D layer inputs and K x chunks Di N states (compute type or bf16: Storage) + T D in
// the compute type (u^{K+1}, then dL/du^{K+1}, then dL/du^k chunk by chunk), plus per-task
// scratch bounded by the chunk size (+ T D for the layered backward's second buffer), plus what
// the wavefront's forward carries to its backward, within the kept budget
// (kernels/cpu/kept_pool.h).
#ifndef ADJSH_ENGINE_ADJOINT_ENGINE_H_
#define ADJSH_ENGINE_ADJOINT_ENGINE_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/mamba2_config.h"
#include "common/model.h"
#include "engine/capabilities.h"
#include "engine/grad_options.h"
#include "engine/grad_result.h"
#include "engine/step_profile.h"
#include "kernels/backend.h"

namespace adjsh {

// INVALID_ARGUMENT for fewer than 2 tokens, token ids >= V, chunk < 1, window < 0, a spill
// directory that cannot be written, or a loss mask of the wrong length or counting no target;
// the device's errors (engine/capabilities.h CheckDevice<float>). Every entry point that
// computes a gradient checks this, and what its model type and runner support
// (engine/capabilities.h Supports). C: MambaConfig or Mamba2Config.
template <typename C>
absl::Status ValidateGradientInputs(const C& config, std::span<const uint32_t> tokens,
                                    const GradOptions& options);

// Validates (above), then computes everything in-process.
template <typename T>
absl::StatusOr<GradResult<T>> ComputeGradient(const ModelParams<T>& params,
                                              std::span<const uint32_t> tokens,
                                              const GradOptions& options);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_ADJOINT_ENGINE_H_
