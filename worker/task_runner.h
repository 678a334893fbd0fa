// Serves the tasks the main loop pulls, one at a time: only kind BACKWARD with ahead = 0 and
// window = 0 (the exact wavefront schedule), dtype F32 or F64. It checks the task against its
// job's config, fetches its inputs (and the layer's parameters unless cached, param_cache.h),
// runs RunBackwardTask (engine/backward_task.h) in the task's dtype and pushes the outputs
// (task_io.h). Any other or invalid task is logged and skipped without a result (its lease
// expires). Main thread only.
#ifndef ADJSH_WORKER_TASK_RUNNER_H_
#define ADJSH_WORKER_TASK_RUNNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

#include "engine/backward_task.h"
#include "proto/adjsh.grpc.pb.h"
#include "worker/param_cache.h"
#include "worker/shared_state.h"
#include "worker/task_io.h"
#include "worker/worker.h"

namespace adjsh::worker {

class TaskRunner {
 public:
  TaskRunner(const WorkerOptions& opt, v1::TaskService::Stub& stub, SharedState& state,
             int max_cached_jobs);

  // Serves `task` to its end, result pushed or not, holding it in the SharedState meanwhile.
  void Handle(const v1::Task& task);

 private:
  enum class Outcome { kDone, kDropped };

  template <typename T>
  Outcome Run(const v1::Task& task, const TaskState& state);
  Outcome End(const std::string& task_id, const NoResult& no_result) const;  // logs it
  void LogProgress();

  const WorkerOptions& opt_;
  SharedState& state_;
  TaskIo io_;
  ParamCache cache_;
  // With a device other than the CPU: its backend, and the last task's layer block there (kept
  // while consecutive tasks share the layer's parameters, so they are uploaded once).
  std::unique_ptr<Backend<float>> backend_;
  std::shared_ptr<const LayerParams<float>> device_params_;
  std::shared_ptr<const MambaConfig> device_config_;
  std::unique_ptr<BlockBackend<float>> device_block_;
  // Reused across tasks (capacity kept).
  std::tuple<BackwardTaskOutputs<float>, BackwardTaskOutputs<double>> out_;
  Clock::time_point progress_start_;
  uint64_t bytes_received_ = 0, bytes_sent_ = 0;  // of the task being served, for the metrics
  bool accepted_ = false;                         // the coordinator's answer to its result
  int64_t progress_done_ = 0;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_TASK_RUNNER_H_
