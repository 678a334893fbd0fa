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
#include "engine/span_tensors.h"
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
  const Outcome outcome = Run(task, *held);
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
  auto drop = [&](std::string why) {
    return End(tid, NoResult{.skipped = false, .why = std::move(why)});
  };
  const std::optional<SpanPhase> phase = PhaseOf(task.kind());
  if (!phase) return skip(absl::StrCat("unsupported task kind ", v1::Task::Kind_Name(task.kind())));
  if (!backend_) return skip(absl::StrCat(opt_.device.ToString(), " is not usable"));
  absl::StatusOr<SpanStore::Job*> found = store_.JobFor(task);
  if (!found.ok()) return skip(absl::StrCat("job ", task.job_id(), ": ", found.status().message()));
  SpanStore::Job& job = **found;
  if (job.mamba2) return RunMamba2(task, held, job);
  const MambaConfig& cfg = *job.config;
  if (absl::Status st = backend_->CheckConfig(cfg); !st.ok()) return skip(st.message());
  if (task.masked()) {  // the head's greedy count, which a device may lack
    if (absl::Status st = backend_->Require(Op::kHeadAccuracy); !st.ok())
      return skip(st.message());
  }
  const SpanPlan& plan = *job.plans.at(task.sequence());
  const std::pair<int64_t, int64_t> key{task.sequence(), task.span()};
  const SpanTask span_task{*phase, task.layer(), task.span()};
  const int64_t id = plan.Id(span_task.phase, span_task.layer, span_task.span);
  if (id < 0) return skip(absl::StrCat("the plan has no such task"));
  auto owned = job.spans.find(key);
  // With a worker tree the parameters come down the tree, and the partials go up it.
  const bool tree = task.has_tree();
  if (tree) {
    if (std::optional<std::string> why = EnterTree(task, job)) return skip(*why);
  }
  const bool need_params = job.model == nullptr;
  const bool include_params = need_params && !tree;
  const bool include_span = owned == job.spans.end() || !owned->second->Ready(span_task);

  // The model of the task's version, from named tensors.
  auto take_model = [&](const TensorMap& named) -> absl::Status {
    absl::StatusOr<ModelParams<float>> params = ParamsFromTensors<float>(cfg, named);
    if (!params.ok()) return params.status();
    job.spans.clear();  // they point into the model being replaced
    owned = job.spans.end();
    job.params = std::make_unique<ModelParams<float>>(*std::move(params));
    job.model = std::make_unique<BackendModel<float>>(
        BackendModel<float>::Make(*job.params, *backend_));
    return absl::OkStatus();
  };
  TensorMap got;
  if (need_params && tree) {  // kept at once: a later failure of this task does not refetch
    TensorMap named;
    if (std::optional<NoResult> no = TreeParams(held, task, ParamBytesF32(cfg),
                                                16 * cfg.num_hidden_layers + 64, named))
      return End(tid, *no);
    if (absl::Status st = take_model(named); !st.ok())
      return skip(absl::StrCat("parameters: ", st.message()));
  }
  if (std::optional<NoResult> no = io_.Fetch(held, include_params, include_span,
                                             SpanInputLimits(cfg.num_hidden_layers,
                                                             cfg.hidden_size,
                                                             cfg.inner() * cfg.state_size,
                                                             cfg.conv_kernel, ParamBytesF32(cfg),
                                                             plan, task.span()),
                                             got)) {
    return End(tid, *no);
  }
  for (const auto& [name, tensor] : got) bytes_received_ += tensor.data.size();

  if (include_params) {
    if (absl::Status st = take_model(TakeParamTensors(got)); !st.ok())
      return skip(absl::StrCat("parameters: ", st.message()));
  }
  if (job.model == nullptr) return skip("the parameters were not sent");

  const Clock::time_point started = Clock::now();
  double rebuild_s = 0;
  if (include_span) {  // a fresh span, replayed up to this task
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;
    if (absl::Status st = TakeSpanStart(cfg, plan, task.span(), task.masked(), got, tokens, mask);
        !st.ok())
      return skip(st.message());
    auto work = std::make_unique<SpanWork<float>>(
        *job.model, plan, task.span(), std::move(tokens), std::move(mask), task.targets(),
        task.storage() == "bf16" ? Storage::kBF16 : Storage::kCompute, opt_.spill_dir);
    for (int64_t r : plan.ReplayIds(id)) {
      absl::StatusOr<SpanInputs<float>> in =
          TakeSpanInputs<float>(cfg, plan, plan.task(r), ReplayPrefix(plan.task(r)), got);
      if (!in.ok()) return skip(absl::StrCat("replay: ", in.status().message()));
      SpanOutputs<float> discard;
      if (absl::Status st = work->Run(plan.task(r), *in, discard); !st.ok())
        return skip(st.message());
    }
    job.spans[key] = std::move(work);
    rebuild_s = NoteRebuild(task, plan, id, started);
  }
  absl::StatusOr<SpanInputs<float>> in = TakeSpanInputs<float>(cfg, plan, span_task, "", got);
  if (!in.ok()) return skip(in.status().message());
  if (!got.empty()) return skip(absl::StrCat("unexpected tensor \"", got.begin()->first, "\""));

  std::string why;
  if (!state_.TaskAlive(held, &why)) return drop(why);
  if (state_.Stopping()) return drop("stopping");

  SpanWork<float>& work = *job.spans.at(key);
  const Clock::time_point computing = rebuild_s > 0 ? Clock::now() : started;
  SpanResult<float> result;
  if (absl::Status st = work.Run(span_task, *in, result.out); !st.ok()) return skip(st.message());
  result.compute_seconds = std::chrono::duration<double>(Clock::now() - computing).count();
  result.rebuild_seconds = rebuild_s;
  rows_ = plan.range(task.span()).len;
  // The span's last task: its rows are of no more use.
  if (span_task.phase == SpanPhase::kBackward && span_task.layer == 0) job.spans.erase(key);

  // With a tree, finite partials become leaves of it here; non-finite ones travel in the
  // result, which the coordinator refuses as it would any.
  const bool leaves = tree && FirstNonFinite(result.out).empty();
  if (leaves) {
    if (absl::Status st = peers_.AddLeaves(
            task, TakeLeaves(span_task, cfg.num_hidden_layers, result.out));
        !st.ok())
      return skip(st.message());
  }
  return PushResult(task, held, PutSpanResult<float>(cfg, plan, span_task, result, !leaves),
                    result.compute_seconds);
}

std::optional<std::string> TaskRunner::EnterTree(const v1::Task& task,
                                                 const SpanStore::Job& job) {
  const v1::WorkerTree& t = task.tree();
  if (t.span_owner_size() != task.spans() || t.self() < 0 || t.self() >= t.peer_size())
    return "the task's worker tree does not fit its plan";
  for (int32_t o : t.span_owner())
    if (o < 0 || o >= t.peer_size()) return "the task's worker tree names no such worker";
  peers_.Enter(task, job.groups);
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
  state_.Log(1, absl::StrFormat("%d tasks done, %.2f tasks/s, spans hold %.1f MiB, RSS %.1f MiB "
                                "(peak %.1f MiB)",
                                done,
                                seconds > 0 ? static_cast<double>(progress_done_) / seconds : 0.0,
                                MiB(store_.kept_bytes()), MiB(ResidentBytes()),
                                MiB(PeakResidentBytes())));
  progress_start_ = now;
  progress_done_ = 0;
}

}  // namespace adjsh::worker
