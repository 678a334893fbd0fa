// What the worker's three threads share, under one mutex: the main thread (pulls and serves
// tasks), the heartbeat thread (renews or cancels the task held, re-registers after a
// coordinator restart) and the stop watcher (turns the stop flag into wake-ups and
// cancellations). It holds the registration, the task held, the RPCs in flight (so that a stop,
// a cancelled task or the shutdown can cancel them), the stop and shutdown flags and the
// counters; and it writes the log.
//
//   grpc::ClientContext ctx;
//   SharedState::CallScope scope(state, ctx, CallKind::kStoppable, task_id);  // while it runs
//   s = FromGrpcStatus(stub.PullTask(&ctx, request, &response));
#ifndef ADJSH_WORKER_SHARED_STATE_H_
#define ADJSH_WORKER_SHARED_STATE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "grpcpp/client_context.h"
#include "worker/worker.h"

namespace adjsh::worker {

using Clock = std::chrono::steady_clock;

// The task being served; the heartbeat thread renews and cancels it (fields under the
// SharedState's mutex).
struct TaskState {
  std::string task_id, lease_id, worker_id;  // worker_id: the id it was leased under
  int64_t lease_ms = 0;                       // Task.lease_expires_ms; <= 0: unknown
  Clock::time_point lease_deadline;
  bool cancelled = false;
  std::string why;  // why it was cancelled
};

// When a call in flight is cancelled, besides at the shutdown and when the task it serves is.
enum class CallKind {
  kStoppable,  // at the stop: RegisterWorker, PullTask, FetchInputs
  kPush,       // stop_grace after the stop: PushResult of a finished task
  kHeartbeat,  // never
};

class SharedState {
 public:
  SharedState(int log_level, std::chrono::milliseconds stop_grace);
  SharedState(const SharedState&) = delete;
  SharedState& operator=(const SharedState&) = delete;

  // "[worker HH:MM:SS.mmm] message" on stderr when level <= log_level (0 warnings and errors,
  // 1 info, 2 debug).
  void Log(int level, const std::string& message) const;

  // Stop and shutdown.
  void SetStopFlag(std::atomic<bool>& stop);  // before any other thread starts
  bool Stopping() const { return stop_ != nullptr && stop_->load(); }
  // Waits up to `d` (false at once when stopping, also when it starts during the wait).
  bool SleepFor(std::chrono::milliseconds d);
  // The stop watcher thread, until Shutdown: notices the stop flag within kStopPoll (a signal
  // handler cannot notify), wakes every waiter, cancels the stoppable calls at once and the
  // pushes after stop_grace.
  void WatchLoop();
  // How often WatchLoop looks at the stop flag. Each look wakes a thread that, on a machine
  // whose cores all compute, takes one from a task: at 10 ms the two workers of a 2-core
  // machine spent more CPU time on a step (docs/BENCHMARKS.md, "What was tried").
  static constexpr std::chrono::milliseconds kStopPoll{100};
  // Ends WatchLoop and the heartbeat waits and cancels every call in flight, for good.
  void Shutdown();

  // Registration.
  std::string worker_id() const;
  // A successful RegisterWorker (counted). A task held under an earlier id is cancelled: it
  // cannot be reported any more.
  void Registered(const std::string& worker_id, int64_t heartbeat_interval_ms);

  // The task held (listed in heartbeats).
  void Hold(std::shared_ptr<TaskState> task);
  void Release(bool dropped);  // none held; a dropped task is counted
  // Not cancelled and its lease not surely expired; `why` says otherwise.
  bool TaskAlive(const TaskState& task, std::string* why) const;
  // Every call serving that task; with pushes = false, a PushResult in flight is left to finish
  // (the coordinator's answer to a delivered result is authoritative: accepted if it was this
  // worker's lease that completed the task, refused otherwise).
  void CancelCalls(const std::string& task_id, bool pushes = true);
  // The held task's calls, when that task has been cancelled (CancelCalls).
  void CancelCallsOfCancelledTask();

  // Heartbeats.
  struct HeartbeatTurn {
    std::string worker_id;
    int64_t interval_ms;
    std::shared_ptr<TaskState> held;  // to list; null when none, or cancelled
  };
  // Waits one heartbeat interval; nullopt at the shutdown.
  std::optional<HeartbeatTurn> NextHeartbeat();
  // The answer to the heartbeat sent at `sent` that listed `held`: the coordinator cancelled
  // it (`cancelled`), or its lease runs lease_ms from `sent`. Returns whether the cancellation
  // applies: false once `held` is no longer the task held (it finished meanwhile).
  bool HeartbeatAnswered(const std::shared_ptr<TaskState>& held, bool cancelled,
                         Clock::time_point sent);

  // Counters.
  WorkerStats stats() const;
  template <typename F>
  void UpdateStats(F update) {
    std::lock_guard<std::mutex> lock(mu_);
    update(stats_);
  }

  class CallScope;

 private:
  struct ActiveCall {
    CallKind kind;
    std::string task_id;  // the task the call serves; empty for none
    bool cancelled = false;
  };
  // Cancels every call in flight, not cancelled yet, that `which` selects (mu_ held).
  template <typename Which>
  void CancelLocked(Which which);

  const int log_level_;
  const std::chrono::milliseconds stop_grace_;
  std::atomic<bool>* stop_ = nullptr;

  mutable std::mutex mu_;  // everything below
  std::condition_variable cv_;  // stop seen, shutdown
  bool shutdown_ = false;
  bool stop_seen_ = false;
  Clock::time_point stop_time_;
  std::string worker_id_;
  int64_t heartbeat_interval_ms_ = 5000;
  std::shared_ptr<TaskState> current_;  // the task held
  std::map<grpc::ClientContext*, ActiveCall> calls_;
  WorkerStats stats_;
};

// Registers a call's context for cancellation (stop, task cancelled, shutdown) while it runs.
class SharedState::CallScope {
 public:
  CallScope(SharedState& state, grpc::ClientContext& ctx, CallKind kind,
            std::string task_id = "");
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  SharedState& state_;
  grpc::ClientContext& ctx_;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_SHARED_STATE_H_
