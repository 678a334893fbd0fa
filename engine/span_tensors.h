// The span tasks' inputs and outputs as named tensors: the wire form of engine/span_work.h that
// the coordinator (coordinator/task_service.cc) and the worker (worker/task_runner.cc) share.
// Every name, shape and dtype a task (engine/span_plan.h) sends or receives is decided here, and
// checked exactly on receipt: a tensor missing, extra, or of another shape or dtype is an
// INVALID_ARGUMENT naming it. Letters: H = min(W - 1, t0) halo rows of span s, D, Di, N, V;
// for a Mamba-2 model (Di, N) is the (H P, N) of its heads' states.
//
//   inputs    "halo_u" (H, D)        forward, k > 0 and s > 0
//             "h0" (Di, N)           kForward, s > 0
//             "du_halo" (H(s+1), D)  backward, k < K-1 and s < S-1
//             "mu" (Di, N)           kBackward, s < S-1
//   a span's start, when the worker holds nothing of it: "tokens" I64 (ids [t0 - H,
//             min(T, t0 + len + 1))), "mask" U8 (the same positions; only with a loss mask),
//             and the inputs of every task that rebuilds it (SpanLedger::Replay) under
//             "replay.<phase>.<layer>.<name>"
//   outputs   kForwardSummary "sigma" (Di), "h_end" (Di, N)
//             kForward        k < K-1: "halo_next" (min(W - 1, len), D); k = K-1 (the head):
//                             "loss_sum" F64 (), "correct" I64 (), "backbone.embeddings.weight"
//                             (V, D), "backbone.norm_f.weight" (D)
//             kBackwardSummary "m" (Di, N)
//             kBackward       layer k's partials under their Hugging Face names,
//                             "du_halo_prev" (H, D); k = 0: "backbone.embeddings.weight" (V, D)
//             every task      "compute_seconds" F64 (), "rebuild_seconds" F64 () (0: none),
//                             "device_traffic" I64 (6): DeviceTraffic's six counts in order
#ifndef ADJSH_ENGINE_SPAN_TENSORS_H_
#define ADJSH_ENGINE_SPAN_TENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/mamba2_config.h"
#include "common/device_memory.h"
#include "common/safetensors.h"
#include "engine/families/families.h"
#include "engine/span_plan.h"
#include "engine/span_work.h"

namespace adjsh {

// The prefix of a replayed task's inputs: "replay.fwd.3." (SpanPhaseName, layer).
std::string ReplayPrefix(const SpanTask& task);

// C: the model's config (MambaConfig, Mamba2Config: engine/families/family.h); both have the same
// task tensors but for the names and shapes of a layer's partials (Di = H P for Mamba-2).
template <typename T, typename C>
void PutSpanInputs(const C& c, const SpanPlan& plan, const SpanTask& task,
                   const SpanInputs<T>& in, const std::string& prefix, TensorMap& out);
// Moves the inputs of `task` (under `prefix`) out of `got`, checking each against the plan.
template <typename T, typename C>
absl::StatusOr<SpanInputs<T>> TakeSpanInputs(const C& c, const SpanPlan& plan,
                                             const SpanTask& task, const std::string& prefix,
                                             TensorMap& got);

void PutSpanStart(const std::vector<uint32_t>& tokens, const std::vector<uint8_t>& mask,
                  TensorMap& out);
// "tokens" (and "mask" when masked) of span s, checked: the right count, ids < V.
template <typename C>
absl::Status TakeSpanStart(const C& c, const SpanPlan& plan, int64_t s, bool masked,
                           TensorMap& got, std::vector<uint32_t>& tokens,
                           std::vector<uint8_t>& mask);

// What a task's result carries, with its timings.
template <typename T, typename Layer = LayerParams<T>>
struct SpanResult {
  SpanOutputs<T, Layer> out;
  double compute_seconds = 0, rebuild_seconds = 0;
  DeviceTraffic device;  // what the task moved to and from its device (zero on the CPU)
};
template <typename T, typename C>
using SpanResultOf = SpanResult<T, typename Family<C>::template Layer<T>>;

// partials = false: without the parameter partials (the worker tree sums them).
template <typename T, typename C>
TensorMap PutSpanResult(const C& c, const SpanPlan& plan, const SpanTask& task,
                        const SpanResultOf<T, C>& r, bool partials = true);
// Exactly the tensors `task` returns (nothing missing, nothing extra), in T's dtype.
template <typename T, typename C>
absl::StatusOr<SpanResultOf<T, C>> TakeSpanResult(const C& c, const SpanPlan& plan,
                                                  const SpanTask& task, TensorMap& got,
                                                  bool partials = true);
// Whether a result carries parameter partials (any of their names is among `got`).
template <typename C>
bool HasPartials(const C& c, const SpanPlan& plan, const SpanTask& task, const TensorMap& got);
// The byte count of the largest result `task` can have (for the receiver's stream limits).
template <typename C>
uint64_t SpanResultBytes(const C& c, const SpanPlan& plan, const SpanTask& task,
                         int64_t value_bytes);

// "NAME[i] = v" for the first NaN or infinity among the outputs, or "" when all are finite.
template <typename T, typename Layer>
std::string FirstNonFinite(const SpanOutputs<T, Layer>& out);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPAN_TENSORS_H_
