// One task's traffic with the coordinator (the protocol: worker.h): FetchInputs and PushResult,
// streamed, each retried with backoff on transient failures as long as the task's lease can
// still be alive, and cancelled with the task (SharedState::CallScope). The tensors themselves:
// engine/span_tensors.h.
#ifndef ADJSH_WORKER_TASK_IO_H_
#define ADJSH_WORKER_TASK_IO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "engine/span_plan.h"
#include "proto/adjsh.grpc.pb.h"
#include "proto/tensor_codec.h"
#include "worker/shared_state.h"
#include "worker/worker.h"

namespace adjsh::worker {

// Why a task ends without a result: skipped (the coordinator sent something this worker cannot
// use: a warning) or dropped (lease lost, cancelled, stopping: routine).
struct NoResult {
  bool skipped = false;
  std::string why;
};

// The parameters among a task's inputs, moved out of `got`: every "backbone.*" tensor and
// "lm_head.weight" (an untied head; a task's own inputs have other names).
TensorMap TakeParamTensors(TensorMap& got);

// The most a task's inputs can be, for span s of plan: the model (param_bytes in f32), the
// span's tokens and mask, and the summaries of a replay of every layer (f64 at most, with room
// for the stream's own framing). A model of K layers, width D, (Di, N) state, conv kernel W.
AssemblerLimits SpanInputLimits(int64_t K, int64_t D, int64_t DiN, int64_t W,
                                uint64_t param_bytes, const SpanPlan& plan, int64_t s);

class TaskIo {
 public:
  TaskIo(const WorkerOptions& opt, v1::TaskService::Stub& stub, SharedState& state);

  // FetchInputs for `task` (counted in params_fetched when include_params; include_span: the
  // span's start and replay too): every tensor that arrived into `got`, by name. nullopt when
  // they all did, in a stream within `limits`.
  std::optional<NoResult> Fetch(const TaskState& task, bool include_params, bool include_span,
                                const AssemblerLimits& limits, TensorMap& got);

  // PushResult of `results` for `task` (counted in tasks_done, and in results_rejected when
  // not accepted). nullopt when delivered; `response` then holds the answer. accepted = false
  // is normal (a late or duplicate result, or a stale lease).
  std::optional<NoResult> Push(const TaskState& task, const TensorMap& results,
                               v1::PushResultResponse& response);

 private:
  const WorkerOptions& opt_;
  v1::TaskService::Stub& stub_;
  SharedState& state_;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_TASK_IO_H_
