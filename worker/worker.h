// adjsh worker: pulls exact-backward (layer k, chunk c) tasks from a coordinator's TaskService
// (proto/adjsh.proto), fetches their inputs as streamed tensors, runs RunBackwardTask
// (engine/backward_task.h) in the task's dtype and pushes the outputs back as streamed tensors.
//
//   Worker w(WorkerOptions{.coordinator = "127.0.0.1:50051"});
//   std::atomic<bool> stop{false};      // set it (e.g. from a signal handler) to end Run
//   absl::Status s = w.Run(stop);
//
// The protocol, as this worker speaks it:
//   RegisterWorker{name, "cpu", physical memory} -> worker_id, heartbeat_interval_ms; again after
//     NOT_FOUND from PullTask or Heartbeat (a coordinator restart); a task held then is dropped.
//   A heartbeat thread sends Heartbeat{worker_id, [held task], RSS, peak RSS} every interval;
//     a held task named in cancelled_task_ids is dropped (its in-flight RPC is cancelled).
//   PullTask -> NoTask: wait retry_after_ms; Task: only kind BACKWARD with ahead = 0 and
//     window = 0 (the exact wavefront schedule), dtype F32 or F64. Any other task is logged and
//     skipped without a result (its lease expires).
//   FetchInputs{include_params = the layer's parameters are not cached}: "u" (halo + len, D),
//     "g" (len, D), "h0" (Di, N), optional "mu" (Di, N) (absent = zero / last chunk), and the
//     layer's parameters under their HF names and shapes when asked for. Every tensor's name,
//     shape and dtype is checked (the task's dtype or a narrower float: bf16, f16, f32 for f64
//     tasks); a mismatch is logged and the task skipped. FAILED_PRECONDITION / NOT_FOUND: drop.
//   PushResult: ResultHeader, then the layer's gradient partials (LayerParamSlots order, HF names
//     and shapes), "du" (len, D), "du_halo" (halo, D), "mu_out" (Di, N), all in the task's
//     dtype, in 1 MiB pieces. accepted = false is normal (late or duplicate result).
// Parameters are cached per job for the newest params_version only (older ones are evicted
// when a newer version arrives; a task of an older version fetches without caching); at most
// kMaxCachedJobs jobs are kept (least recently used evicted). The parsed config is cached with
// them.
// Errors: UNAVAILABLE and DEADLINE_EXCEEDED are retried with exponential backoff (100 ms doubling
// to 2 s) forever for RegisterWorker and PullTask, and for FetchInputs / PushResult as long as
// the task's lease can still be alive (lease_expires_ms after the last heartbeat that renewed
// it). Every RPC has a deadline.
// Stop: Run notices the flag within ~10 ms; it cancels pulls, fetches and backoff waits at once,
// drops a task whose compute has not begun, lets a running compute finish and pushes its result
// within stop_grace, then stops the heartbeat and returns OK.
#ifndef ADJSH_WORKER_WORKER_H_
#define ADJSH_WORKER_WORKER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model.h"
#include "engine/backward_task.h"
#include "proto/adjsh.grpc.pb.h"

namespace adjsh::worker {

struct WorkerOptions {
  std::string coordinator;  // HOST:PORT of the coordinator's TaskService (insecure channel)
  std::string name;         // RegisterWorker.worker_name; empty = the host name
  uint64_t memory_bytes = 0;  // RegisterWorker.memory_bytes; 0 = physical memory
  int64_t log_every = 100;    // progress line every this many finished tasks; 0 = never
  int log_level = 1;          // 0 warnings and errors, 1 + info (registration, progress), 2 + debug
  std::chrono::milliseconds rpc_deadline{30000};      // unary RPCs
  std::chrono::milliseconds stream_deadline{600000};  // FetchInputs / PushResult streams
  std::chrono::milliseconds backoff_min{100}, backoff_max{2000};
  std::chrono::milliseconds stop_grace{5000};  // for pushing a finished result after stop
};

// Counters, readable at any time (for tests and logs).
struct WorkerStats {
  int64_t registrations = 0;    // successful RegisterWorker calls
  int64_t tasks_pulled = 0;     // tasks received from PullTask
  int64_t tasks_done = 0;       // results pushed (accepted or not)
  int64_t results_rejected = 0;  // of those, answered accepted = false
  int64_t tasks_dropped = 0;    // lease lost, cancelled, invalid or unsupported: no result
  int64_t params_fetched = 0;   // FetchInputs calls with include_params = true
};

class Worker {
 public:
  static constexpr int kMaxCachedJobs = 4;

  explicit Worker(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves tasks until `stop` becomes true, then returns OK. Returns an error only for a
  // coordinator that refuses this worker for good (INVALID_ARGUMENT, UNIMPLEMENTED,
  // PERMISSION_DENIED, UNAUTHENTICATED from RegisterWorker or PullTask). Call once.
  absl::Status Run(std::atomic<bool>& stop);

  WorkerStats stats() const;

 private:
  // One job's cached config and parameters (newest params_version only), per compute type.
  struct JobCache {
    std::string config_json;
    std::shared_ptr<const MambaConfig> config;
    bool has_version = false;
    uint64_t params_version = 0;
    std::map<int64_t, std::shared_ptr<const LayerParams<float>>> f32;  // by layer
    std::map<int64_t, std::shared_ptr<const LayerParams<double>>> f64;
    uint64_t last_used = 0;
  };
  // The task being served; the heartbeat thread renews and cancels it (fields under mu_).
  struct TaskState {
    std::string task_id, lease_id, worker_id;  // worker_id: the id it was leased under
    int64_t lease_ms = 0;                       // Task.lease_expires_ms; <= 0: unknown
    std::chrono::steady_clock::time_point lease_deadline;
    bool cancelled = false;
    std::string why;  // why it was cancelled
  };
  class CallScope;
  enum class CallKind { kStoppable, kPush, kHeartbeat };
  struct ActiveCall {
    CallKind kind;
    std::string task_id;  // the task the call serves; empty for none
    bool cancelled = false;
  };
  enum class Outcome { kDone, kDropped };

  void Log(int level, const std::string& message) const;
  bool Stopping() const { return stop_ != nullptr && stop_->load(); }
  // Waits up to `d` (false at once when stopping, also when it starts during the wait).
  bool SleepFor(std::chrono::milliseconds d);
  std::chrono::milliseconds NextBackoff(std::chrono::milliseconds& current) const;

  absl::Status Register();                          // until success, stop, or a fatal error
  absl::Status Reregister(const std::string& stale_id);  // once per stale id, from either thread
  std::string worker_id() const;

  void HeartbeatLoop();
  void WatchLoop();
  void CancelCalls(const std::string& task_id);  // every call serving that task

  void HandleTask(const v1::Task& task);
  template <typename T>
  Outcome RunTask(const v1::Task& task, const std::shared_ptr<TaskState>& state);
  JobCache* JobFor(const v1::Task& task);  // nullptr (logged) for a bad config
  // Not cancelled and its lease not surely expired; `why` says otherwise.
  bool TaskAlive(const TaskState& state, std::string* why) const;
  void LogProgress();

  const WorkerOptions opt_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TaskService::Stub> stub_;
  std::atomic<bool>* stop_ = nullptr;

  mutable std::mutex mu_;  // everything below
  std::condition_variable cv_;  // stop seen, shutdown
  bool shutdown_ = false;
  bool stop_seen_ = false;
  std::chrono::steady_clock::time_point stop_time_;
  std::string worker_id_;
  int64_t heartbeat_interval_ms_ = 5000;
  std::shared_ptr<TaskState> current_;  // the task held, listed in heartbeats
  std::map<grpc::ClientContext*, ActiveCall> calls_;
  WorkerStats stats_;

  std::mutex register_mu_;  // one registration at a time

  // Main thread only.
  std::map<std::string, JobCache> jobs_;
  uint64_t job_clock_ = 0;
  BackwardTaskOutputs<float> out_f32_;  // reused across tasks (capacity kept)
  BackwardTaskOutputs<double> out_f64_;
  std::chrono::steady_clock::time_point progress_start_;
  int64_t progress_done_ = 0;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_WORKER_H_
