// What a worker's span task (TaskRunner::RunSpanTask, worker/span_task.cc) takes of a model
// type: where its job keeps the model, the model on the backend and the owned spans
// (worker/span_store.h), how the parameters are read from named tensors, what the backend
// must have for a task, and the span owner's type. One for Mamba-1 (MambaConfig), one for
// Mamba-2 (Mamba2Config); every step of a task is written once, over these.
#ifndef ADJSH_WORKER_TASK_FAMILY_H_
#define ADJSH_WORKER_TASK_FAMILY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/mamba2_config.h"
#include "common/model.h"
#include "common/safetensors.h"
#include "kernels/mamba2_backend.h"
#include "common/mamba2_model.h"
#include "engine/mamba2_span_work.h"
#include "engine/span_work.h"
#include "kernels/backend.h"
#include "worker/span_store.h"

namespace adjsh::worker {

template <typename Config>
struct TaskFamily;

template <>
struct TaskFamily<MambaConfig> {
  using Params = ModelParams<float>;
  using Model = BackendModel<float>;
  using Work = SpanWork<float>;
  using Outputs = SpanOutputs<float>;
  using Spans = std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Work>>;

  static const MambaConfig& Config(const SpanStore::Job& j) { return *j.config; }
  static std::unique_ptr<Params>& ParamsOf(SpanStore::Job& j) { return j.params; }
  static std::unique_ptr<Model>& ModelOf(SpanStore::Job& j) { return j.model; }
  static Spans& SpansOf(SpanStore::Job& j) { return j.spans; }
  static uint64_t ParamBytes(const MambaConfig& c) { return ParamBytesF32(c); }
  static absl::StatusOr<Params> FromTensors(const MambaConfig& c, const TensorMap& named) {
    return ParamsFromTensors<float>(c, named);
  }
  // The shape the backend takes, and with a loss mask the head's greedy count.
  static absl::Status Check(const Backend<float>& backend, const MambaConfig& c, bool masked) {
    if (absl::Status s = backend.CheckConfig(c); !s.ok()) return s;
    return masked ? backend.Require(Op::kHeadAccuracy) : absl::OkStatus();
  }
  static absl::StatusOr<Model> MakeModel(const Params& p, Backend<float>& backend) {
    return Model::Make(p, backend);
  }
};

template <>
struct TaskFamily<Mamba2Config> {
  using Params = Mamba2Params<float>;
  using Model = Mamba2BackendModel<float>;
  using Work = Mamba2SpanWork<float>;
  using Outputs = Mamba2SpanOutputs<float>;
  using Spans = std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Work>>;

  static const Mamba2Config& Config(const SpanStore::Job& j) { return *j.mamba2; }
  static std::unique_ptr<Params>& ParamsOf(SpanStore::Job& j) { return j.mamba2_params; }
  static std::unique_ptr<Model>& ModelOf(SpanStore::Job& j) { return j.mamba2_model; }
  static Spans& SpansOf(SpanStore::Job& j) { return j.mamba2_spans; }
  static uint64_t ParamBytes(const Mamba2Config& c) { return Mamba2ParamBytesF32(c); }
  static absl::StatusOr<Params> FromTensors(const Mamba2Config& c, const TensorMap& named) {
    return Mamba2ParamsFromTensors<float>(c, named);
  }
  // A Mamba-2 layer (f32 storage on a GPU), the head, and with a loss mask its greedy count.
  static absl::Status Check(const Backend<float>& backend, const Mamba2Config&, bool masked) {
    return CheckMamba2Backend(backend, masked);
  }
  static absl::StatusOr<Model> MakeModel(const Params& p, Backend<float>& backend) {
    return Model::Make(p, backend);
  }
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_TASK_FAMILY_H_
