#include "worker/task_runner.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/proc_stats.h"
#include "kernels/cpu/kept_pool.h"
#include "proto/span_kind.h"
#include "worker/metrics.h"

namespace adjsh::worker {
namespace {

using std::chrono::milliseconds;

double MiB(int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

}  // namespace

TaskRunner::TaskRunner(const WorkerOptions& opt, v1::TaskService::Stub& stub, SharedState& state,
                       PeerHub& peers, int max_cached_jobs)
    : opt_(opt),
      state_(state),
      peers_(peers),
      io_(opt, stub, state),
      store_(max_cached_jobs),
      progress_start_(Clock::now()) {
  absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(opt.device);
  if (backend.ok()) {
    backend_ = *std::move(backend);
  } else {  // the worker command checks the device first; tasks are then skipped
    state_.Log(0, absl::StrCat("device ", opt.device.ToString(), ": ", backend.status().message()));
  }
}

void TaskRunner::Handle(const v1::Task& task) {
  auto held = std::make_shared<TaskState>();
  held->task_id = task.task_id();
  held->lease_id = task.lease_id();
  held->worker_id = state_.worker_id();
  held->lease_ms = task.lease_expires_ms();
  held->lease_deadline =
      Clock::now() + milliseconds(std::max<int64_t>(task.lease_expires_ms(), 0));
  state_.Hold(held);
  const Clock::time_point pulled = Clock::now();
  bytes_received_ = bytes_sent_ = 0;
  accepted_ = false;
  rows_ = 0;
  state_.Log(2, absl::StrFormat("task %s leased: %s layer %d span %d/%d, lease %d ms",
                                task.task_id(), v1::Task::Kind_Name(task.kind()), task.layer(),
                                task.span(), task.spans(), task.lease_expires_ms()));
  skip_why_.reset();
  const Outcome outcome = Run(task, *held);
  if (skip_why_) {
    if (skipped_.size() >= kMaxSkipped) skipped_.erase(skipped_.begin());
    v1::SkippedTask& s = skipped_.emplace_back();
    s.set_task_id(task.task_id());
    s.set_lease_id(task.lease_id());
    s.set_reason(*skip_why_);
  }
  state_.Release(outcome == Outcome::kDropped);
  if (opt_.metrics != nullptr) {
    if (outcome == Outcome::kDone) {
      opt_.metrics->TaskDone(std::chrono::duration<double>(Clock::now() - pulled).count(), rows_,
                             bytes_received_, bytes_sent_, accepted_);
    } else {
      opt_.metrics->TaskFailed(bytes_received_);
    }
  }
  if (outcome == Outcome::kDone) LogProgress();
}

TaskRunner::Outcome TaskRunner::End(const std::string& task_id, const NoResult& no_result) const {
  if (no_result.skipped) {
    state_.Log(0, absl::StrCat("task ", task_id, ": ", no_result.why, ": skipped"));
    skip_why_ = no_result.why;
  } else {
    state_.Log(1, absl::StrCat("task ", task_id, " dropped: ", no_result.why));
  }
  return Outcome::kDropped;
}


TaskRunner::Outcome TaskRunner::Run(const v1::Task& task, const TaskState& held) {
  const std::string& tid = task.task_id();
  auto skip = [&](absl::string_view why) {
    return End(tid, NoResult{.skipped = true, .why = std::string(why)});
  };
  const std::optional<SpanPhase> phase = PhaseOf(task.kind());
  if (!phase) return skip(absl::StrCat("unsupported task kind ", v1::Task::Kind_Name(task.kind())));
  if (!backend_) return skip(absl::StrCat(opt_.device.ToString(), " is not usable"));
  absl::StatusOr<SpanStore::Job*> found = store_.JobFor(task);
  if (!found.ok()) return skip(absl::StrCat("job ", task.job_id(), ": ", found.status().message()));
  SpanStore::Job& job = **found;
  return std::visit(
      [&](auto& m) {
        using F = typename std::remove_reference_t<decltype(m)>::ModelFamily;
        return RunSpanTask<F>(task, held, job, m);
      },
      job.model);
}

std::optional<std::string> TaskRunner::EnterTree(const v1::Task& task,
                                                 const SpanStore::Job& job) {
  const v1::WorkerTree& t = task.tree();
  if (t.span_owner_size() != task.spans() || t.self() < 0 || t.self() >= t.peer_size())
    return "the task's worker tree does not fit its plan";
  for (int32_t o : t.span_owner())
    if (o < 0 || o >= t.peer_size()) return "the task's worker tree names no such worker";
  peers_.Enter(task, job.groups, backend_->ResidentRows());
  return std::nullopt;
}

std::optional<NoResult> TaskRunner::TreeParams(const TaskState& held, const v1::Task& task,
                                               uint64_t param_bytes, int64_t max_tensors,
                                               TensorMap& named) {
  AssemblerLimits limits;
  limits.max_total_bytes = param_bytes + (1 << 20);
  limits.max_tensor_bytes = limits.max_total_bytes;
  limits.max_tensors = max_tensors;
  if (std::optional<NoResult> no = peers_.FetchParams(held, task, limits, named)) return no;
  for (const auto& [name, tensor] : named) bytes_received_ += tensor.data.size();
  return std::nullopt;
}

double TaskRunner::NoteRebuild(const v1::Task& task, const SpanPlan& plan, int64_t id,
                               Clock::time_point started) {
  // A span's first task makes it from its tokens: that is the task's own work, not a rebuild.
  if (plan.ReplayIds(id).empty()) return 0;
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  state_.Log(1, absl::StrFormat("span %d of job %s rebuilt up to %s of layer %d (%.3f s)",
                                task.span(), task.job_id(),
                                std::string(SpanPhaseName(plan.task(id).phase)), task.layer(),
                                seconds));
  return seconds;
}

TaskRunner::Outcome TaskRunner::PushResult(const v1::Task& task, const TaskState& held,
                                           const TensorMap& results, double compute_seconds) {
  const std::string& tid = task.task_id();
  v1::PushResultResponse response;
  if (std::optional<NoResult> no = io_.Push(held, results, response)) return End(tid, *no);
  for (const auto& [name, tensor] : results) bytes_sent_ += tensor.data.size();
  accepted_ = response.accepted();
  if (response.accepted()) {
    state_.Log(2, absl::StrFormat("task %s done: %s layer %d span %d, %.3f s compute", tid,
                                  std::string(SpanPhaseName(*PhaseOf(task.kind()))),
                                  task.layer(), task.span(), compute_seconds));
  } else {
    // Normal: a late or duplicate result, or a stale lease.
    state_.Log(2, absl::StrCat("task ", tid, ": result not accepted (", response.reason(), ")"));
  }
  return Outcome::kDone;
}

void TaskRunner::LogProgress() {
  ++progress_done_;
  const int64_t done = state_.stats().tasks_done;
  if (opt_.log_every <= 0 || done % opt_.log_every != 0) return;
  const Clock::time_point now = Clock::now();
  const double seconds = std::chrono::duration<double>(now - progress_start_).count();
  state_.Log(1, absl::StrFormat("%d tasks done, %.2f tasks/s, spans hold %.1f MiB, kept "
                                "activations %.1f MiB, RSS %.1f MiB (peak %.1f MiB)",
                                done,
                                seconds > 0 ? static_cast<double>(progress_done_) / seconds : 0.0,
                                MiB(store_.kept_bytes()), MiB(cpu::KeptBytes()),
                                MiB(ResidentBytes()), MiB(PeakResidentBytes())));
  progress_start_ = now;
  progress_done_ = 0;
}

}  // namespace adjsh::worker
