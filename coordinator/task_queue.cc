#include "coordinator/task_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/strings.h"

namespace adjsh::coordinator {

const char* TaskStateName(TaskState state) {
  switch (state) {
    case TaskState::kWaiting: return "waiting";
    case TaskState::kReady: return "ready";
    case TaskState::kLeased: return "leased";
    case TaskState::kDone: return "done";
  }
  return "unknown";
}

TaskQueue::TaskQueue(Clock clock) : clock_(std::move(clock)) {}

absl::Status TaskQueue::AddTask(int64_t task_id, std::string payload,
                                std::span<const int64_t> dependencies) {
  std::vector<int64_t> deps(dependencies.begin(), dependencies.end());
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());

  absl::MutexLock lock(&mu_);
  if (tasks_.contains(task_id)) {
    return absl::AlreadyExistsError(absl::StrCat("task ", task_id, " was already added"));
  }
  // Validate everything before changing anything, so a refused task leaves no trace.
  for (int64_t dep : deps) {
    if (!tasks_.contains(dep)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "task ", task_id, " depends on task ", dep,
          ", which is not in the queue (add dependencies first; this also rules out cycles)"));
    }
  }
  Task task;
  task.payload = std::move(payload);
  for (int64_t dep : deps) {
    Task& d = tasks_.at(dep);
    d.dependents.push_back(task_id);
    if (d.state != TaskState::kDone) ++task.unmet;
  }
  task.state = task.unmet == 0 ? TaskState::kReady : TaskState::kWaiting;
  if (task.state == TaskState::kReady) ready_.insert(task_id);
  tasks_.emplace(task_id, std::move(task));
  return absl::OkStatus();
}

absl::StatusOr<LeaseResult> TaskQueue::Lease(std::string_view worker_id,
                                             absl::Duration lease_duration,
                                             const std::function<bool(int64_t)>& eligible) {
  if (worker_id.empty()) return absl::InvalidArgumentError("Lease: empty worker id");
  if (lease_duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Lease: lease duration must be positive, got ", absl::FormatDuration(lease_duration)));
  }
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  LeaseResult result;
  result.finished = done_ == static_cast<int64_t>(tasks_.size());
  auto pick = ready_.begin();
  if (eligible) {
    while (pick != ready_.end() && !eligible(*pick)) ++pick;
  }
  if (pick == ready_.end()) return result;

  const int64_t task_id = *pick;
  ready_.erase(pick);
  leased_.insert(task_id);
  Task& task = tasks_.at(task_id);
  task.state = TaskState::kLeased;
  task.lease_id = next_lease_id_++;
  task.worker_id = std::string(worker_id);
  task.expiry = now + lease_duration;
  task.lease_duration = lease_duration;
  ++task.attempts;
  ++granted_;
  result.task = LeasedTask{task_id, task.lease_id, task.expiry, task.attempts, task.payload};
  return result;
}

absl::StatusOr<absl::Time> TaskQueue::Renew(int64_t task_id, int64_t lease_id,
                                            std::string_view worker_id) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = tasks_.find(task_id);
  Task* task = it == tasks_.end() ? nullptr : &it->second;
  if (absl::Status s = CheckLeaseLocked(task_id, task, lease_id, "renewal"); !s.ok()) return s;
  if (task->worker_id != worker_id) {
    // Lease ids are unique, so this is a confused or misconfigured worker, not a race.
    return absl::FailedPreconditionError(
        absl::StrCat("lease ", lease_id, " of task ", task_id, " belongs to worker ",
                     task->worker_id, ", not ", ToAbsl(worker_id), "; renewal refused"));
  }
  task->expiry = now + task->lease_duration;
  return task->expiry;
}

absl::Status TaskQueue::Complete(int64_t task_id, int64_t lease_id) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  // The sweep runs first, so a result that arrives at or after its lease's expiry is refused
  // even when no other worker has asked for work since.
  ExpireLocked(now);
  auto it = tasks_.find(task_id);
  Task* task = it == tasks_.end() ? nullptr : &it->second;
  if (absl::Status s = CheckLeaseLocked(task_id, task, lease_id, "result"); !s.ok()) {
    if (task != nullptr) ++rejected_;
    return s;
  }
  // Accept: the one place a task becomes DONE, under the lock, so exactly once.
  leased_.erase(task_id);
  task->state = TaskState::kDone;
  task->done_order = done_++;
  task->done_lease_id = lease_id;
  task->lease_id = 0;
  task->worker_id.clear();
  for (int64_t dependent : task->dependents) {
    Task& d = tasks_.at(dependent);
    if (--d.unmet == 0 && d.state == TaskState::kWaiting) {
      d.state = TaskState::kReady;
      ready_.insert(dependent);
    }
  }
  return absl::OkStatus();
}

absl::Status TaskQueue::Release(int64_t task_id, int64_t lease_id) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = tasks_.find(task_id);
  Task* task = it == tasks_.end() ? nullptr : &it->second;
  if (absl::Status s = CheckLeaseLocked(task_id, task, lease_id, "release"); !s.ok()) return s;
  RequeueLocked(task_id, *task, LeaseEnd::kReleased);
  return absl::OkStatus();
}

int64_t TaskQueue::ReleaseWorker(std::string_view worker_id) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  int64_t count = 0;
  for (auto it = leased_.begin(); it != leased_.end();) {
    const int64_t task_id = *it++;  // advance first: RequeueLocked erases task_id from leased_
    Task& task = tasks_.at(task_id);
    if (task.worker_id == worker_id) {
      RequeueLocked(task_id, task, LeaseEnd::kWorkerReleased);
      ++count;
    }
  }
  return count;
}

int64_t TaskQueue::ExpireLeases() {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  return ExpireLocked(now);
}

absl::StatusOr<TaskInfo> TaskQueue::GetTask(int64_t task_id) const {
  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) return absl::NotFoundError(absl::StrCat("no task ", task_id));
  const Task& t = it->second;
  TaskInfo info;
  info.id = task_id;
  info.state = t.state;
  info.unmet_dependencies = t.unmet;
  info.attempts = t.attempts;
  info.done_order = t.done_order;
  if (t.state == TaskState::kLeased) {
    info.lease_id = t.lease_id;
    info.worker_id = t.worker_id;
    info.expiry = t.expiry;
  }
  return info;
}

QueueStats TaskQueue::Stats() const {
  absl::MutexLock lock(&mu_);
  QueueStats s;
  s.total = static_cast<int64_t>(tasks_.size());
  s.ready = static_cast<int64_t>(ready_.size());
  s.leased = static_cast<int64_t>(leased_.size());
  s.done = done_;
  s.waiting = s.total - s.ready - s.leased - s.done;
  s.leases_granted_total = granted_;
  s.leases_expired_total = expired_;
  s.leases_released_total = released_;
  s.results_rejected_total = rejected_;
  return s;
}

bool TaskQueue::Finished() const {
  absl::MutexLock lock(&mu_);
  return done_ == static_cast<int64_t>(tasks_.size());
}

int64_t TaskQueue::ExpireLocked(absl::Time now) {
  int64_t count = 0;
  for (auto it = leased_.begin(); it != leased_.end();) {
    const int64_t task_id = *it++;
    Task& task = tasks_.at(task_id);
    if (now >= task.expiry) {
      RequeueLocked(task_id, task, LeaseEnd::kExpired);
      ++count;
    }
  }
  return count;
}

void TaskQueue::RequeueLocked(int64_t task_id, Task& task, LeaseEnd how) {
  if (how == LeaseEnd::kExpired) ++expired_;
  else ++released_;
  task.ended_lease_id = task.lease_id;
  task.ended_how = how;
  task.state = TaskState::kReady;
  task.lease_id = 0;
  task.worker_id.clear();
  leased_.erase(task_id);
  ready_.insert(task_id);
}

absl::Status TaskQueue::CheckLeaseLocked(int64_t task_id, const Task* task, int64_t lease_id,
                                         const char* action) const {
  if (task == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no task ", task_id, " in this queue; ", action, " from lease ", lease_id,
                     " refused"));
  }
  const std::string what = absl::StrCat("lease ", lease_id, " of task ", task_id);
  if (task->state == TaskState::kDone) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", task_id, " is already done (result of lease ", task->done_lease_id,
                     " accepted); ", action, " from lease ", lease_id, " refused"));
  }
  if (task->state == TaskState::kLeased && task->lease_id == lease_id) return absl::OkStatus();
  const std::string now_state =
      task->state == TaskState::kLeased
          ? absl::StrCat("the task is leased again under lease ", task->lease_id)
          : absl::StrCat("the task is ", TaskStateName(task->state));
  if (task->ended_lease_id == lease_id && task->ended_how != LeaseEnd::kNone) {
    const char* how = task->ended_how == LeaseEnd::kExpired    ? "expired"
                      : task->ended_how == LeaseEnd::kReleased ? "was released"
                                                               : "was revoked (worker released)";
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", how, "; ", action, " refused, ", now_state));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, " is not the task's current lease (superseded or never granted); ", action,
                   " refused, ", now_state));
}

}  // namespace adjsh::coordinator
