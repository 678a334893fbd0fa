// The adjoint engine: loss and exact gradient of the mean next-token loss of one sequence,
// computed by adjoint sharding in-process (DESIGN.md §3).
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
#include "engine/grad_result.h"
#include "engine/step_profile.h"
#include "kernels/backend.h"

namespace adjsh {

enum class Schedule { kSpans, kWavefront, kTwoPass };

// How the values kept from the forward for the backward (layer inputs, chunk-boundary states)
// are stored: in the compute type, or rounded to bf16 (half the bytes of f32; the gradient is
// that of the model rounding there, within bf16's 2^-9 relative rounding of the exact one).
// Adjoints, gradients and dL/du stay in the compute type either way.
enum class Storage { kCompute, kBF16 };

// The cotangent each layer's backward receives at its output.
enum class Cotangent {
  kExact,       // dL/du^{k+1}: the exact gradient, through the norms and SSMs of later layers
  kTopOfStack,  // dL/du^{K+1} for every layer, its input held fixed: the paper's Proposition 3
                // read literally (DESIGN.md §3). Exact for K = 1, an approximation for K > 1;
                // all layers become independent. The embedding's cotangent dL/du^1 is layer
                // 1's input cotangent under the same rule. In-process only, layer by layer.
};

struct GradOptions {
  int64_t chunk = 256;  // C: tokens per chunk (the unit of one kernel call)
  // kSpans: the span schedule (engine/span_plan.h), the one workers run too; the exact gradient
  // of every option but a truncated window or the top-of-stack cotangent, which run layer by
  // layer (BackwardLayered). kWavefront, kTwoPass: the in-process chunk schedules below.
  Schedule schedule = Schedule::kSpans;
  int64_t spans = 0;    // S for kSpans; 0 = SpanPlan::DefaultSpans(T, chunk, W)
  int64_t window = 0;   // Wt: 0 = exact adjoint; else truncated to Wt tokens (Wt >= T is exact)
  int threads = 0;      // 0: one per hardware thread
  Storage storage = Storage::kCompute;
  Cotangent cotangent = Cotangent::kExact;
  // Empty: every next-token target counts. Else one entry per token: the target at position t
  // (token t, predicted from the tokens before it) counts iff loss_mask[t] != 0 (loss_mask[0]
  // has no target); the loss is the mean over the counted targets. Must outlive the call.
  std::span<const uint8_t> loss_mask;
  // Non-empty: the layer inputs live in memory-mapped files in this directory (unlinked at
  // once), which the kernel can write out to disk under memory pressure. Same results.
  std::string spill_dir;
  // Progress: (phase, layers done, layers) after each layer of the forward and the backward,
  // and once for the head; possibly from a worker thread, never two calls at once.
  std::function<void(std::string_view, int64_t, int64_t)> progress;
  // Where every kernel call runs (kernels/backend.h). CUDA takes f32 and the exact gradient
  // (any schedule and span count), without a loss mask (CheckDevice).
  Device device;
  // The loss only: the span schedule's forward (SpanPlan forward_only) and no backward; the
  // result's loss, targets and correct are those of the full step, bit for bit, and its grad is
  // empty. Evaluation through the workers (Trainer::set_evaluation_source). kSpans only.
  bool forward_only = false;
};

// "full" (the compute type) or "bf16"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Storage> ParseStorage(std::string_view name);
std::string_view StorageName(Storage storage);

// "exact" | "top-of-stack" (the command-line names); INVALID_ARGUMENT for anything else.
absl::StatusOr<Cotangent> CotangentFromName(std::string_view name);
// "spans" | "wavefront" | "two-pass" (--schedule); INVALID_ARGUMENT for anything else.
absl::StatusOr<Schedule> ScheduleFromName(std::string_view name);

// INVALID_ARGUMENT for fewer than 2 tokens, token ids >= V, chunk < 1, window < 0, a spill
// directory that cannot be written, or a loss mask of the wrong length or counting no target;
// the device's errors (CheckDevice<float>). Every entry point that computes a gradient checks
// this. C: MambaConfig or Mamba2Config (whose device is checked by CheckMamba2Backend,
// engine/mamba2_backend.h).
template <typename C>
absl::Status ValidateGradientInputs(const C& config, std::span<const uint32_t> tokens,
                                    const GradOptions& options);

// OK on the CPU; else the device's backend must exist for T, take the config and support every
// op the options' schedule uses (UNIMPLEMENTED or FAILED_PRECONDITION naming what is missing).
template <typename T>
absl::Status CheckDevice(const MambaConfig& config, const GradOptions& options);

// Validates (above), then computes everything in-process.
template <typename T>
absl::StatusOr<GradResult<T>> ComputeGradient(const ModelParams<T>& params,
                                              std::span<const uint32_t> tokens,
                                              const GradOptions& options);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_ADJOINT_ENGINE_H_
