// The options of one gradient computation (GradOptions) and the names the command line and job
// specs give them. Every layer that describes a gradient includes this header alone; the
// dispatcher that runs one is engine/adjoint_engine.h.
#ifndef ADJSH_ENGINE_GRAD_OPTIONS_H_
#define ADJSH_ENGINE_GRAD_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
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
                // read literally (docs/MATH.md, "The adjoint of the scan"). Exact for K = 1, an approximation for K > 1;
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

}  // namespace adjsh

#endif  // ADJSH_ENGINE_GRAD_OPTIONS_H_
