#include "worker/shared_state.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <utility>

#include "absl/strings/str_format.h"

namespace adjsh::worker {

using std::chrono::milliseconds;

SharedState::SharedState(int log_level, milliseconds stop_grace)
    : log_level_(log_level), stop_grace_(stop_grace) {}

void SharedState::Log(int level, const std::string& message) const {
  if (level > log_level_) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const int64_t ms =
      std::chrono::duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  const std::string line = absl::StrFormat("[worker %s.%03d] %s%s\n", stamp, ms,
                                           level == 0 ? "warning: " : "", message);
  std::fputs(line.c_str(), stderr);
}

// ---------------------------------------------------------------------------------------------
// Stop and shutdown

void SharedState::SetStopFlag(std::atomic<bool>& stop) { stop_ = &stop; }

bool SharedState::SleepFor(milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [&] { return stop_seen_ || shutdown_ || Stopping(); });
}

template <typename Which>
void SharedState::CancelLocked(Which which) {
  for (auto& [ctx, call] : calls_) {
    if (!call.cancelled && which(call)) {
      ctx->TryCancel();
      call.cancelled = true;
    }
  }
}

void SharedState::WatchLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutdown_) {
    cv_.wait_for(lock, kStopPoll, [&] { return shutdown_; });
    if (shutdown_) break;
    if (!stop_seen_ && Stopping()) {
      stop_seen_ = true;
      stop_time_ = Clock::now();
      cv_.notify_all();
    }
    if (!stop_seen_) continue;
    const bool grace_over = Clock::now() - stop_time_ >= stop_grace_;
    CancelLocked([&](const ActiveCall& call) {
      return call.kind == CallKind::kStoppable || (call.kind == CallKind::kPush && grace_over);
    });
  }
}

void SharedState::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    CancelLocked([](const ActiveCall&) { return true; });
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// Registration and the task held

std::string SharedState::worker_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_id_;
}

void SharedState::Registered(const std::string& worker_id, int64_t heartbeat_interval_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  worker_id_ = worker_id;
  heartbeat_interval_ms_ = heartbeat_interval_ms;
  ++stats_.registrations;
  if (current_ != nullptr && current_->worker_id != worker_id_ && !current_->cancelled) {
    current_->cancelled = true;
    current_->why = "the worker registered again";
  }
}

void SharedState::Hold(std::shared_ptr<TaskState> task) {
  std::lock_guard<std::mutex> lock(mu_);
  current_ = std::move(task);
}

void SharedState::Release(bool dropped) {
  std::lock_guard<std::mutex> lock(mu_);
  current_.reset();
  if (dropped) ++stats_.tasks_dropped;
}

bool SharedState::TaskAlive(const TaskState& task, std::string* why) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (task.cancelled) {
    *why = task.why;
    return false;
  }
  if (task.lease_ms > 0 && Clock::now() >= task.lease_deadline) {
    *why = "its lease has expired";
    return false;
  }
  return true;
}

void SharedState::CancelCalls(const std::string& task_id, bool pushes) {
  std::lock_guard<std::mutex> lock(mu_);
  CancelLocked([&](const ActiveCall& call) {
    return call.task_id == task_id && (pushes || call.kind != CallKind::kPush);
  });
}

void SharedState::CancelCallsOfCancelledTask() {
  std::string task;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (current_ != nullptr && current_->cancelled) task = current_->task_id;
  }
  if (!task.empty()) CancelCalls(task);
}

// ---------------------------------------------------------------------------------------------
// Heartbeats and counters

std::optional<SharedState::HeartbeatTurn> SharedState::NextHeartbeat() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, milliseconds(std::max<int64_t>(heartbeat_interval_ms_, 10)),
               [&] { return shutdown_; });
  if (shutdown_) return std::nullopt;
  HeartbeatTurn turn{worker_id_, heartbeat_interval_ms_, current_};
  if (turn.held != nullptr && turn.held->cancelled) turn.held = nullptr;
  return turn;
}

bool SharedState::HeartbeatAnswered(const std::shared_ptr<TaskState>& held, bool cancelled,
                                    Clock::time_point sent) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held != current_) return false;
  if (!held->cancelled) {
    if (cancelled) {
      held->cancelled = true;
      held->why = "cancelled by the coordinator";
    } else if (held->lease_ms > 0) {
      held->lease_deadline = sent + milliseconds(held->lease_ms);
    }
  }
  return cancelled;
}

WorkerStats SharedState::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

// ---------------------------------------------------------------------------------------------
// CallScope

SharedState::CallScope::CallScope(SharedState& state, grpc::ClientContext& ctx, CallKind kind,
                                  std::string task_id)
    : state_(state), ctx_(ctx) {
  std::lock_guard<std::mutex> lock(state_.mu_);
  ActiveCall call{kind, std::move(task_id)};
  // A cancellation that happened before the call was registered still applies.
  const bool task_gone = !call.task_id.empty() && state_.current_ != nullptr &&
                         state_.current_->task_id == call.task_id &&
                         state_.current_->cancelled;
  if (state_.shutdown_ || task_gone || (kind == CallKind::kStoppable && state_.stop_seen_)) {
    ctx_.TryCancel();  // also valid before the call starts
    call.cancelled = true;
  }
  state_.calls_.emplace(&ctx_, std::move(call));
}

SharedState::CallScope::~CallScope() {
  std::lock_guard<std::mutex> lock(state_.mu_);
  state_.calls_.erase(&ctx_);
}

}  // namespace adjsh::worker
