// The lifecycle of a job step's tasks (docs/ARCHITECTURE.md "A step", "Faults"), in one place:
//
//   WAITING --(all dependencies DONE)--> READY --Lease()--> LEASED --Complete()--> DONE
//                                          ^                   |
//                                          +-- expired / Release() / ReleaseWorker() --+
//
// Tasks are fixed by the job (the (layer, span) tasks of a step's plan, engine/span_plan.h,
// each after the tasks whose results it reads), not by the workers.
// A pulled task that is not completed before its lease expires is handed out again; a late or
// duplicate result is refused, so each task's result is accepted exactly once. That is what makes
// the reduction bitwise identical with or without worker failures and retries.
//
// Order: READY tasks are handed out lowest id first, whenever they became ready. Requeued tasks
// therefore go ahead of later ones, which matters because later tasks usually depend on them.
// Time: a lease is live while now < expiry. The clock is injected (tests use a fake one and never
// sleep); it is read before the lock is taken, so it must be thread-safe and must not call back
// into the queue. Every call that touches leases (all but AddTask and the introspection) first
// expires the leases that are due (a "sweep").
// Thread safety: every method may be called from any thread; one absl::Mutex guards all state.
#ifndef ADJSH_COORDINATOR_TASK_QUEUE_H_
#define ADJSH_COORDINATOR_TASK_QUEUE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace adjsh::coordinator {

enum class TaskState { kWaiting, kReady, kLeased, kDone };
const char* TaskStateName(TaskState state);  // "waiting", "ready", "leased", "done"

// What a worker gets from Lease(): enough to run the task and to report its result.
struct LeasedTask {
  int64_t task_id = 0;
  int64_t lease_id = 0;  // unique within the queue, never reused; 0 is never a lease id
  absl::Time expiry;     // the lease is live while now < expiry; Renew() moves it
  int attempt = 0;       // 1 on the first hand-out, 2 after one expiry/release, ...
  std::string payload;   // opaque to the queue (e.g. a serialized task description)
};

struct LeaseResult {
  std::optional<LeasedTask> task;  // empty: nothing READY right now
  bool finished = false;           // every task is DONE: the worker can stop asking
};

// One task, for tests, logs and status pages.
struct TaskInfo {
  int64_t id = 0;
  TaskState state = TaskState::kWaiting;
  int64_t unmet_dependencies = 0;  // dependencies not yet DONE
  int64_t lease_id = 0;            // current lease (LEASED only), else 0
  std::string worker_id;           // holder of the current lease (LEASED only)
  absl::Time expiry = absl::InfinitePast();  // of the current lease (LEASED only)
  int attempts = 0;                // leases granted so far
  int64_t done_order = -1;         // 0 for the first task accepted, 1 for the next, ...
};

// Counts for metrics. Everything ever leased ends one way: with nothing LEASED,
// leases_granted_total == done + leases_expired_total + leases_released_total.
struct QueueStats {
  int64_t total = 0;
  int64_t waiting = 0;  // queued behind unfinished dependencies
  int64_t ready = 0;    // queued and runnable (including requeued)
  int64_t leased = 0;
  int64_t done = 0;
  int64_t leases_granted_total = 0;
  int64_t leases_expired_total = 0;
  int64_t leases_released_total = 0;   // Release() and ReleaseWorker()
  int64_t results_rejected_total = 0;  // Complete() refusals: late, duplicate, superseded
};

// into's *_total counters += from's (the lease counters kept across steps).
inline void AddLeaseCounters(const QueueStats& from, QueueStats& into) {
  into.leases_granted_total += from.leases_granted_total;
  into.leases_expired_total += from.leases_expired_total;
  into.leases_released_total += from.leases_released_total;
  into.results_rejected_total += from.results_rejected_total;
}

class TaskQueue {
 public:
  using Clock = std::function<absl::Time()>;

  explicit TaskQueue(Clock clock = [] { return absl::Now(); });
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  // Adds a task. Its dependencies must have been added before (so the graph is acyclic by
  // construction; duplicates are ignored); ones already DONE count as met.
  // ALREADY_EXISTS: the id is taken. INVALID_ARGUMENT: a dependency is not in the queue.
  absl::Status AddTask(int64_t task_id, std::string payload, std::span<const int64_t> dependencies);

  // Hands the lowest-id READY task to `worker_id` for `lease_duration`. No task is not an error:
  // the result says whether everything is finished. INVALID_ARGUMENT: empty worker id or a
  // duration <= 0.
  // With `eligible`: the lowest-id READY task it accepts (it runs under the queue's lock: it
  // must not call the queue).
  absl::StatusOr<LeaseResult> Lease(std::string_view worker_id, absl::Duration lease_duration,
                                    const std::function<bool(int64_t)>& eligible = nullptr);

  // Heartbeat: extends a live lease to now + its original duration and returns the new expiry.
  // NOT_FOUND: unknown task. FAILED_PRECONDITION: the lease is not the task's current live lease
  // (expired, released, superseded, task done) or belongs to another worker: stop working on it.
  absl::StatusOr<absl::Time> Renew(int64_t task_id, int64_t lease_id, std::string_view worker_id);

  // Accepts the task's result, exactly once: only for its current, unexpired lease. Marks the
  // task DONE and makes its dependents READY once all their dependencies are DONE.
  // NOT_FOUND: unknown task. FAILED_PRECONDITION: already DONE (duplicate), or the lease expired,
  // was released or superseded (late); the caller must discard the result.
  absl::Status Complete(int64_t task_id, int64_t lease_id);

  // Returns a leased task to READY (the worker is shutting down). Same codes as Renew.
  absl::Status Release(int64_t task_id, int64_t lease_id);

  // Requeues every task leased by `worker_id` (declared dead); returns how many.
  int64_t ReleaseWorker(std::string_view worker_id);

  // Requeues every LEASED task whose lease has expired; returns how many. Lease() and the other
  // mutating calls do this too, so calling it is only needed for fresh metrics.
  int64_t ExpireLeases();

  // Introspection. These take no clock reading: counts are as of the last sweep.
  absl::StatusOr<TaskInfo> GetTask(int64_t task_id) const;  // NOT_FOUND: unknown task
  QueueStats Stats() const;
  bool Finished() const;  // every added task is DONE (true for an empty queue)

 private:
  // How a task's most recent lease ended without a result; for precise refusal messages.
  enum class LeaseEnd { kNone, kExpired, kReleased, kWorkerReleased };

  struct Task {
    std::string payload;
    std::vector<int64_t> dependents;  // tasks that list this one as a dependency
    int64_t unmet = 0;
    TaskState state = TaskState::kWaiting;
    int64_t lease_id = 0;
    std::string worker_id;
    absl::Time expiry = absl::InfinitePast();
    absl::Duration lease_duration;
    int attempts = 0;
    int64_t done_order = -1;
    int64_t done_lease_id = 0;   // the lease whose result was accepted
    int64_t ended_lease_id = 0;  // most recent lease that ended without a result
    LeaseEnd ended_how = LeaseEnd::kNone;
  };

  int64_t ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RequeueLocked(int64_t task_id, Task& task, LeaseEnd how) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK iff `lease_id` is the task's current live lease (after the sweep); else the refusal.
  absl::Status CheckLeaseLocked(int64_t task_id, const Task* task, int64_t lease_id,
                                const char* action) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const Clock clock_;
  mutable absl::Mutex mu_;
  std::unordered_map<int64_t, Task> tasks_ ABSL_GUARDED_BY(mu_);  // node-based: stable references
  std::set<int64_t> ready_ ABSL_GUARDED_BY(mu_);   // ordered: lowest id is handed out first
  std::set<int64_t> leased_ ABSL_GUARDED_BY(mu_);  // swept for expiry; at most ~one per worker
  int64_t next_lease_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t granted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t expired_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t released_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_TASK_QUEUE_H_
