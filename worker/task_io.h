// One task's traffic with the coordinator (the protocol: worker.h): FetchInputs and PushResult,
// streamed, each retried with backoff on transient failures as long as the task's lease can
// still be alive, and cancelled with the task (SharedState::CallScope). And the tensors at both
// ends: what must arrive, its checks and conversion, and what goes back.
#ifndef ADJSH_WORKER_TASK_IO_H_
#define ADJSH_WORKER_TASK_IO_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "engine/backward_task.h"
#include "proto/adjsh.grpc.pb.h"
#include "proto/tensor_codec.h"
#include "worker/shared_state.h"
#include "worker/worker.h"

namespace adjsh::worker {

// A tensor that must (or may) arrive: its name and shape.
struct Expected {
  std::string name;
  std::vector<int64_t> shape;
};

// The task inputs, in this order: "u" (halo + len, D) the layer input, halo rows first; "g"
// (len, D); "h0" (Di, N); "mu" (Di, N), optional (absent = zero / last chunk).
std::vector<Expected> InputTensors(const MambaConfig& cfg, int64_t halo, int64_t len);

// Limits for the assembler that receives `lists`: it refuses anything larger than the largest
// expected stream (f64 throughout).
AssemblerLimits LimitsFor(std::initializer_list<const std::vector<Expected>*> lists);

// Moves tensor `e` out of `got` into `out`, converted to T, after checking its presence, shape
// and dtype: T's or a narrower float (INVALID_ARGUMENT naming the tensor otherwise).
template <typename T>
absl::Status TakeTensor(TensorMap& got, const Expected& e, std::vector<T>& out);

// Moves "u", "g", "h0" and, when sent, "mu" (`inputs`: InputTensors) into `in` (TakeTensor).
template <typename T>
absl::Status TakeInputs(TensorMap& got, const std::vector<Expected>& inputs,
                        BackwardTaskInputs<T>& in);

// What PushResult sends for layer k's outputs `out`, in this order, all in T's dtype: the
// gradient partials (LayerParamSlots order, HF names and shapes), "du" (len, D), "du_halo"
// (halo, D), "mu_out" (Di, N).
using ResultTensors = std::vector<std::pair<std::string, HostTensor>>;
template <typename T>
ResultTensors ToResultTensors(const MambaConfig& cfg, int64_t k, int64_t halo, int64_t len,
                              const BackwardTaskOutputs<T>& out);

// Why a task ends without a result: skipped (the coordinator sent something this worker cannot
// use: a warning) or dropped (lease lost, cancelled, stopping: routine).
struct NoResult {
  bool skipped = false;
  std::string why;
};

class TaskIo {
 public:
  TaskIo(const WorkerOptions& opt, v1::TaskService::Stub& stub, SharedState& state);

  // FetchInputs for `task` (counted in params_fetched when include_params): every tensor that
  // arrived into `got`, by name. nullopt when they all did, in a stream within `limits`.
  std::optional<NoResult> Fetch(const TaskState& task, bool include_params,
                                const AssemblerLimits& limits, TensorMap& got);

  // PushResult of `results` for `task` (counted in tasks_done, and in results_rejected when
  // not accepted). nullopt when delivered; `response` then holds the answer. accepted = false
  // is normal (a late or duplicate result, or a stale lease).
  std::optional<NoResult> Push(const TaskState& task, const ResultTensors& results,
                               v1::PushResultResponse& response);

 private:
  const WorkerOptions& opt_;
  v1::TaskService::Stub& stub_;
  SharedState& state_;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_TASK_IO_H_
