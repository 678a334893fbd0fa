// What the owner of one span keeps and computes (docs/MATH.md "Spans"), for any model
// type: a worker, or a thread of the in-process engine, runs the span's tasks of
// engine/span_plan.h on its own rows. BasicSpanWork<Math> is written once: the task order
// (Ready), the span's rows and g (engine/span_state.h SpanRows), the halo rows in and out, the
// head task, the embedding lookup's partial and what g holds as the backward goes down. Math is
// the layer math, each task's loop over the span's chunks and what it keeps besides the rows,
// written once over the layer op table of kernels/chunk_ops.h (engine/span_math.h):
//   Math(model, rows); ForwardSummary(rows, k, out); Forward(rows, k, h0, top);
//   BackwardSummary(rows, k, out); Backward(rows, k, mu, out, du); DropLayer(k); kept_bytes().
// Every kernel call goes through the backend (kernels/backend.h). A task is a pure function of
// the span's kept values and its SpanInputs, so whoever runs it, it returns the same bits.
#ifndef ADJSH_ENGINE_SPAN_WORK_H_
#define ADJSH_ENGINE_SPAN_WORK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/mamba2_model.h"
#include "common/model.h"
#include "engine/span_math.h"
#include "engine/span_plan.h"
#include "engine/span_state.h"

namespace adjsh {

// Where a resident span's (V, D) and layer partials go after its task (BasicSpanWork::Run):
// down to the host (out.embed, out.grad), or left where the rows are (out.embed_sum,
// out.grad_sum) for a sum taken there, with or without a check that they are finite
// (out.partials_nonfinite, down with the task's other outputs). No effect on host rows.
enum class Partials {
  kHost,
  kDevice,         // the in-process step's sums (engine/device_sums.h), a rebuild's replays
  kDeviceChecked,  // a worker's tree (engine/tree_reduce.h), whose leaves must be finite
};

template <typename Math>
class BasicSpanWork {
 public:
  using Model = typename Math::Model;
  using Outputs = typename Math::Outputs;
  using T = typename Math::Value;

  // tokens: ids [t0 - H, min(T, t0 + len + 1)) (the rows, their halo, and the next span's first
  // token: the last row's target); mask: empty, or the loss mask over the same positions.
  // n_targets: the targets counted over the whole sequence (the loss is their mean). model and
  // plan outlive the work.
  BasicSpanWork(const Model& model, const SpanPlan& plan, int64_t span,
                std::vector<uint32_t> tokens, std::vector<uint8_t> mask, int64_t n_targets,
                Storage storage, std::string spill_dir);

  // Whether the kept values are those `task` reads: its layer's forward has not run yet
  // (forward), or the backward has come down to its layer (backward). Otherwise the span must
  // be rebuilt (a fresh work replayed up to the task).
  bool Ready(const SpanTask& task) const;
  // Runs the task (Ready must hold: FAILED_PRECONDITION otherwise). out's buffers are resized;
  // a resident span's partials go where `partials` says.
  absl::Status Run(const SpanTask& task, const SpanInputs<T>& in, Outputs& out,
                   Partials partials = Partials::kHost);
  // Brings partials left on the device by Run to the host after all (out.embed, out.grad), as
  // Partials::kHost would have; one wait. Nothing where there are none.
  void PartialsToHost(int64_t layer, Outputs& out);

  int64_t kept_bytes() const;  // what the span holds now

 private:
  void QueuePartialsDown(int64_t k, Outputs& out);       // Download, freed; there at Finish
  void SetHalo(int64_t k, const SpanInputs<T>& in);      // rows [0, H) of u^k
  void AddNextHalo(const SpanInputs<T>& in);             // span s + 1's part of g, once a layer
  void Forward(int64_t k, const SpanInputs<T>& in, Outputs& out);
  void Head(Outputs& out);
  void Backward(int64_t k, const SpanInputs<T>& in, Outputs& out);
  // A (len, D) buffer of the rows' space for g's next value, and the old g given back.
  RowBuffer<T> TakeSpare(size_t n);
  void GiveSpare(RowBuffer<T>&& b);
  static RowBuffer<T>& HostSpare();
  // The span's token ids on the device, as uint32 in T's bytes (a resident head's; else empty).
  const uint32_t* DeviceIds() const { return reinterpret_cast<const uint32_t*>(ids_.data()); }

  const Model& model_;
  const int64_t K_, W_, n_targets_;
  SpanRows<T> rows_;
  Math math_;
  RowBuffer<T> ids_;  // rows_.tokens where the rows are, with a resident head: up once
  int64_t forward_done_ = 0;      // layers whose kForward ran (u^0..u^{forward_done_} kept)
  int64_t g_layer_ = -1;          // g holds dL/du^{g_layer_} (K after the head), or -1
  bool next_halo_added_ = false;  // span s + 1's part of g is in
  int64_t halo_layer_ = 0;        // the layer whose halo rows are in u (layer 0's: its own)
  Partials partials_ = Partials::kHost;  // Run's task's (the resident head checks its dE)
};

// The span owners of the two model types (engine/families/).
template <typename T>
using SpanWork = BasicSpanWork<SpanMath<ModelParams<T>>>;
template <typename T>
using Mamba2SpanWork = BasicSpanWork<SpanMath<Mamba2Params<T>>>;
template <typename T>
using Mamba2SpanOutputs = SpanOutputs<T, Mamba2Layer<T>>;

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPAN_WORK_H_
