// What the TaskService reads off its metrics and status (coordinator/task_service.h): the
// counters of accepted, refused and non-finite results, skipped tasks, rebuilt spans, restarted
// steps, tree roots and parameter snapshots; the bytes on the wire; the current step's task
// counts; the workers connected and live; and why a connected worker gets no tasks (ShunNote).
// Each is read under the service's lock (the byte counts are atomics) and changes nothing.
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/task_service.h"

namespace adjsh::coordinator {

QueueStats TaskServiceImpl::queue_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  QueueStats s;
  if (current_) s = current_->Stats();
  AddLeaseCounters(past_, s);
  return s;
}

TaskServiceImpl::WorkerCounts TaskServiceImpl::worker_counts() const {
  const absl::Time since = absl::Now() - opt_.lease;
  std::lock_guard<std::mutex> lock(mu_);
  WorkerCounts c;
  for (const auto& [id, w] : workers_) {
    c.connected += w.last_seen >= since ? 1 : 0;
    c.live += Live(w, since) ? 1 : 0;
  }
  return c;
}

uint64_t TaskServiceImpl::bytes_sent() const { return bytes_sent_.load(); }
uint64_t TaskServiceImpl::bytes_received() const { return bytes_received_.load(); }

int64_t TaskServiceImpl::results_accepted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accepted_;
}

int64_t TaskServiceImpl::registered_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(workers_.size());
}

int64_t TaskServiceImpl::results_nonfinite() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nonfinite_;
}

int64_t TaskServiceImpl::param_snapshots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return param_snapshots_;
}

std::string TaskServiceImpl::ShunNote() const {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time since = absl::Now() - opt_.lease;
  for (const auto& [id, w] : workers_) {
    if (w.last_seen < since) continue;
    const std::string who = w.name.empty() ? id : w.name;
    if (w.skipped_tasks >= kShunAfterSkipped) {
      return absl::StrCat("worker ", who, " skipped ", w.skipped_tasks,
                          " tasks in a row (the last: ", w.last_skip, ")");
    }
    if (w.nonfinite_results >= kShunAfterNonFinite) {
      return absl::StrCat("worker ", who, " sent ", w.nonfinite_results,
                          " results with non-finite values");
    }
  }
  return "";
}

int64_t TaskServiceImpl::tasks_skipped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return skipped_;
}

int64_t TaskServiceImpl::span_rebuilds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rebuilds_;
}

int64_t TaskServiceImpl::step_restarts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restarts_;
}

int64_t TaskServiceImpl::roots_accepted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return roots_;
}

int64_t TaskServiceImpl::results_rejected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rejected_;
}

}  // namespace adjsh::coordinator
