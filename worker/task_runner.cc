#include "worker/task_runner.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/proc_stats.h"
#include "kernels/cpu/mamba_block.h"
#include "worker/metrics.h"

namespace adjsh::worker {
namespace {

using std::chrono::milliseconds;

double MiB(int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

}  // namespace

TaskRunner::TaskRunner(const WorkerOptions& opt, v1::TaskService::Stub& stub, SharedState& state,
                       int max_cached_jobs)
    : opt_(opt),
      state_(state),
      io_(opt, stub, state),
      cache_(max_cached_jobs),
      progress_start_(Clock::now()) {
  if (!opt.device.is_cpu()) {
    absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(opt.device);
    if (backend.ok()) {
      backend_ = *std::move(backend);
    } else {  // the worker command checks the device first; f32 tasks are then skipped
      state_.Log(0, absl::StrCat("device ", opt.device.ToString(), ": ",
                                 backend.status().message()));
    }
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
  Outcome outcome = Outcome::kDropped;
  const std::string what = absl::StrFormat("task %s (job %s step %d, layer %d chunk %d)",
                                           task.task_id(), task.job_id(), task.step(),
                                           task.layer(), task.chunk());
  state_.Log(2, absl::StrFormat("task %s leased: layer %d chunk %d, lease %d ms", task.task_id(),
                                task.layer(), task.chunk(), task.lease_expires_ms()));
  if (task.kind() != v1::Task::BACKWARD) {
    state_.Log(0, absl::StrCat("unsupported task kind ", v1::Task::Kind_Name(task.kind()), " (",
                               what, "): skipped"));
  } else if (task.ahead() != 0 || task.window() != 0) {
    state_.Log(0, absl::StrFormat(
                      "unsupported truncated BACKWARD (ahead %d, window %d) in %s: skipped",
                      task.ahead(), task.window(), what));
  } else if (task.dtype() == v1::F32) {
    outcome = Run<float>(task, *held);
  } else if (task.dtype() == v1::F64 && !opt_.device.is_cpu()) {
    state_.Log(0, absl::StrCat("f64 is not supported on ", opt_.device.ToString(), " (", what,
                               "): skipped"));
  } else if (task.dtype() == v1::F64) {
    outcome = Run<double>(task, *held);
  } else {
    state_.Log(0, absl::StrCat("unsupported compute dtype ", v1::DType_Name(task.dtype()), " in ",
                               what, ": skipped"));
  }
  state_.Release(outcome == Outcome::kDropped);
  if (opt_.metrics != nullptr) {
    if (outcome == Outcome::kDone) {
      opt_.metrics->TaskDone(std::chrono::duration<double>(Clock::now() - pulled).count(),
                             task.len(), bytes_received_, bytes_sent_, accepted_);
    } else {
      opt_.metrics->TaskFailed(bytes_received_);
    }
  }
  if (outcome == Outcome::kDone) LogProgress();
}

TaskRunner::Outcome TaskRunner::End(const std::string& task_id, const NoResult& no_result) const {
  if (no_result.skipped) {
    state_.Log(0, absl::StrCat("task ", task_id, ": ", no_result.why, ": skipped"));
  } else {
    state_.Log(1, absl::StrCat("task ", task_id, " dropped: ", no_result.why));
  }
  return Outcome::kDropped;
}

template <typename T>
TaskRunner::Outcome TaskRunner::Run(const v1::Task& task, const TaskState& held) {
  const std::string& tid = task.task_id();
  auto skip = [&](absl::string_view why) {
    return End(tid, NoResult{.skipped = true, .why = std::string(why)});
  };
  auto drop = [&](std::string why) {
    return End(tid, NoResult{.skipped = false, .why = std::move(why)});
  };

  absl::StatusOr<ParamCache::Job*> job = cache_.JobFor(task);
  if (!job.ok()) {
    state_.Log(0, absl::StrCat("task ", tid, " of job ", task.job_id(), ": bad config_json: ",
                               job.status().ToString(), ": skipped"));
    return Outcome::kDropped;
  }
  const std::shared_ptr<const MambaConfig> config = (*job)->config();
  const MambaConfig& cfg = *config;
  if (absl::Status st = CheckTask(task, cfg); !st.ok()) return skip(st.message());
  const int64_t k = task.layer(), halo = task.halo(), len = task.len();

  // Parameters: from the cache when it has them for this version, else fetched with the inputs.
  const uint64_t version = task.params_version();
  std::shared_ptr<const LayerParams<T>> params = (*job)->Find<T>(version, k);
  const bool include_params = params == nullptr;

  // What must (and may) arrive.
  const std::vector<Expected> inputs = InputTensors(cfg, halo, len);
  const std::vector<Expected> param_names = LayerParamTensors<T>(cfg, k);
  TensorMap got;
  if (std::optional<NoResult> no = io_.Fetch(held, include_params,
                                             LimitsFor({&inputs, &param_names}), got)) {
    return End(tid, *no);
  }
  for (const auto& [name, tensor] : got) bytes_received_ += tensor.data.size();

  // Check every tensor, then convert.
  BackwardTaskInputs<T> in;
  in.layer = k, in.chunk = task.chunk();
  in.rows = {halo, len, 0};
  if (absl::Status st = TakeInputs(got, inputs, in); !st.ok()) return skip(st.message());
  // Parameters: required when asked for; sent anyway, all of them are taken.
  if (include_params || got.count(param_names[0].name) > 0) {
    absl::StatusOr<std::shared_ptr<const LayerParams<T>>> fetched =
        TakeLayerParams<T>(got, param_names);
    if (!fetched.ok()) return skip(fetched.status().message());
    params = *std::move(fetched);
    (*job)->Keep<T>(version, k, params);
  }
  if (!got.empty()) return skip(absl::StrCat("unexpected tensor \"", got.begin()->first, "\""));

  std::string why;
  if (!state_.TaskAlive(held, &why)) return drop(why);
  if (state_.Stopping()) return drop("stopping");

  // Compute (the block holds references to cfg and *params, both alive until the end here).
  const Clock::time_point started = Clock::now();
  BackwardTaskOutputs<T>& out = std::get<BackwardTaskOutputs<T>>(out_);
  if constexpr (std::is_same_v<T, float>) {
    if (!opt_.device.is_cpu()) {
      if (!backend_) return skip(absl::StrCat(opt_.device.ToString(), " is not usable"));
      if (absl::Status st = backend_->CheckConfig(cfg); !st.ok()) return skip(st.message());
      if (device_params_ != params || device_block_ == nullptr) {
        device_block_ = backend_->MakeBlock(cfg, *params);
        device_params_ = params;
        device_config_ = config;
      }
      RunBackwardTask(*device_block_, cfg, in, out);
    }
  }
  if (opt_.device.is_cpu()) {
    const cpu::MambaBlockCpu<T> block(cfg, *params);
    RunBackwardTask(block, cfg, in, out);
  }
  const double compute_s = std::chrono::duration<double>(Clock::now() - started).count();

  v1::PushResultResponse response;
  const ResultTensors results = ToResultTensors(cfg, k, halo, len, out);
  if (std::optional<NoResult> no = io_.Push(held, results, response)) return End(tid, *no);
  for (const auto& [name, tensor] : results) bytes_sent_ += tensor.data.size();
  accepted_ = response.accepted();
  if (response.accepted()) {
    state_.Log(2, absl::StrFormat("task %s done: layer %d chunk %d, %.3f s compute", tid, k,
                                  task.chunk(), compute_s));
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
  state_.Log(1, absl::StrFormat("%d tasks done, %.2f tasks/s, RSS %.1f MiB (peak %.1f MiB)",
                                done,
                                seconds > 0 ? static_cast<double>(progress_done_) / seconds : 0.0,
                                MiB(ResidentBytes()), MiB(PeakResidentBytes())));
  progress_start_ = now;
  progress_done_ = 0;
}

}  // namespace adjsh::worker
