// Serves the span tasks the main loop pulls, one at a time (engine/span_plan.h): checks the task
// against its job's config and plan, fetches its inputs (with the model when this worker does
// not hold the task's parameter version, and with the span's tokens and replay when it does not
// hold the span ready for the task: a new owner, or one that lost or moved past it), rebuilds
// the span if so, runs the task on the worker's backend and pushes the outputs
// (engine/span_tensors.h). A task of a Mamba-2 model ("model_type": "mamba2") runs its span on
// a Mamba2SpanWork (engine/span_work.h over engine/span_math.h), on the same backend. Any invalid task is logged and
// skipped without a result, and said to the coordinator on the next pull (skipped()), which ends
// its lease. Main thread only.
#ifndef ADJSH_WORKER_TASK_RUNNER_H_
#define ADJSH_WORKER_TASK_RUNNER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "proto/adjsh.grpc.pb.h"
#include "worker/shared_state.h"
#include "worker/span_store.h"
#include "worker/peer.h"
#include "worker/task_io.h"
#include "worker/worker.h"

namespace adjsh::worker {

class TaskRunner {
 public:
  TaskRunner(const WorkerOptions& opt, v1::TaskService::Stub& stub, SharedState& state,
             PeerHub& peers, int max_cached_jobs);

  // Serves `task` to its end, result pushed or not, holding it in the SharedState meanwhile.
  void Handle(const v1::Task& task);

  // The tasks skipped since the coordinator was last told (the next PullTaskRequest.skipped;
  // the caller clears them once a pull went through). At most kMaxSkipped, the newest.
  std::vector<v1::SkippedTask>& skipped() { return skipped_; }
  static constexpr size_t kMaxSkipped = 16;

 private:
  enum class Outcome { kDone, kDropped };

  Outcome Run(const v1::Task& task, const TaskState& state);
  // The task of a job of model type F (engine/families/family.h), m its part of the job, after
  // Run found it: every step written once for every model type (worker/span_task.cc).
  template <typename F>
  Outcome RunSpanTask(const v1::Task& task, const TaskState& state, SpanStore::Job& job,
                      JobModel<F>& m);
  // A task's worker tree, for either model type: checked against the task's plan and entered
  // in the PeerHub; why the task is skipped when the tree does not fit.
  std::optional<std::string> EnterTree(const v1::Task& task, const SpanStore::Job& job);
  // The parameters of the task's version down the tree (at most param_bytes in f32 and
  // max_tensors tensors), their bytes counted.
  std::optional<NoResult> TreeParams(const TaskState& state, const v1::Task& task,
                                     uint64_t param_bytes, int64_t max_tensors, TensorMap& named);
  // Logs it; a skipped task's reason is kept for Handle (skip_why_).
  Outcome End(const std::string& task_id, const NoResult& no_result) const;
  // A span built for `task` (plan's task id) from its tokens: the seconds since `started` when
  // it was replayed up to the task (a rebuild, logged), 0 when the task is the span's first.
  double NoteRebuild(const v1::Task& task, const SpanPlan& plan, int64_t id,
                     Clock::time_point started);
  // Pushes a task's result tensors, counting their bytes and logging the answer.
  Outcome PushResult(const v1::Task& task, const TaskState& state, const TensorMap& results,
                     double compute_seconds);
  void LogProgress();

  std::vector<v1::SkippedTask> skipped_;
  mutable std::optional<std::string> skip_why_;  // End's, for the task Handle serves
  const WorkerOptions& opt_;
  SharedState& state_;
  PeerHub& peers_;  // the worker tree of steps that have one
  TaskIo io_;
  // The worker's device (the CPU is one too): declared before the spans and models it holds
  // (the store's), so that they go first (a resident span's rows are the backend's memory).
  std::unique_ptr<Backend<float>> backend_;
  SpanStore store_;
  Clock::time_point progress_start_;
  uint64_t bytes_received_ = 0, bytes_sent_ = 0;  // of the task being served, for the metrics
  bool accepted_ = false;                         // the coordinator's answer to its result
  int64_t progress_done_ = 0, rows_ = 0;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_TASK_RUNNER_H_
