// The exact gradient of a Mamba-2 model's mean next-token loss over one token sequence,
// in-process on the options' device (docs/MATH.md "Mamba-2"), by the span schedule (engine/span_step.h,
// engine/span_math.h): each span keeps its rows of every layer's input u^k; the backward
// runs the layers from the top down, each span's chunks in reverse (kernels/cpu/mamba2_layer.h),
// after a forward sweep of the span rebuilt its heads' states at the chunk starts; each chunk
// recomputes its own activations from its input rows and its start state. Memory: K T D stored
// numbers (T or bf16), about 2 T D in T (u^K, then dL/du, per span), each layer's span start
// states, one layer's chunk-start states ((T / C) H P N), one chunk's activations per thread,
// and the head's (V, D) partials waiting in the ledger's tree.
#ifndef ADJSH_ENGINE_MAMBA2_GRAD_H_
#define ADJSH_ENGINE_MAMBA2_GRAD_H_

#include <cstdint>
#include <span>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grad_options.h"
#include "engine/grad_result.h"
#include "common/mamba2_model.h"

namespace adjsh {

// loss: the mean over the counted next-token targets; grad: dloss/dparam, every parameter;
// correct: with a loss mask, the counted targets whose logit is the largest (else -1).
template <typename T>
using Mamba2GradResult = GradResult<T, Mamba2Params>;

struct Mamba2GradOptions {
  int64_t chunk = 256;  // C: tokens per chunk (clamped to T)
  // S: the step's spans (engine/span_plan.h; 0: SpanPlan::DefaultSpans), run on `threads`
  // threads (0: one per core). The result depends on S (its combines round), never on the
  // threads.
  int64_t spans = 0;
  int threads = 0;
  // Empty (every target counts) or one entry per token, the target at t counting iff
  // loss_mask[t] != 0, as for Mamba-1 (engine/adjoint_engine.h GradOptions). Must outlive the
  // call.
  std::span<const uint8_t> loss_mask;
  // How the layer inputs are kept (engine/stored_rows.h): in T, or rounded to bf16, in which
  // case every reader, the forward's next layer included, reads the rounded rows, and the
  // gradient is the exact one of the model that rounds there. A spill directory keeps them in
  // memory-mapped files there (the same values).
  Storage storage = Storage::kCompute;
  std::string spill_dir;
  // Where the layers and the head run (kernels/mamba2_chunk_ops.h): the CPU, or a device whose
  // backend has a Mamba-2 layer (UNIMPLEMENTED naming it otherwise).
  Device device;
  // Progress: (phase, layers done, layers) after each layer's forward ("forward") and backward
  // ("backward"), and once for the head ("head"), as Mamba-1's (GradOptions::progress).
  std::function<void(std::string_view, int64_t, int64_t)> progress;
};

// The Mamba-2 gradient's share of a Mamba-1 gradient's options (engine/adjoint_engine.h): the
// chunk, spans, threads, loss mask, storage, spill directory, device and progress; the rest
// (window, cotangent, schedule, forward_only) its callers check or refuse.
Mamba2GradOptions Mamba2GradOptionsFrom(const GradOptions& options);

// tokens: at least 2, each below vocab_size; chunk >= 1. INVALID_ARGUMENT naming the problem
// otherwise.
template <typename T>
absl::StatusOr<Mamba2GradResult<T>> Mamba2Gradient(const Mamba2Params<T>& params,
                                                   std::span<const uint32_t> tokens,
                                                   const Mamba2GradOptions& options);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MAMBA2_GRAD_H_
