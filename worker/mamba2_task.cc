// TaskRunner::RunMamba2 (worker/task_runner.h): a span task of a Mamba-2 model. The same steps
// as a Mamba-1 task's (TaskRunner::Run): the model of the task's version from named tensors,
// the span rebuilt from its tokens and the ledger's replay when this worker does not hold it
// ready, the task run, its result pushed; on the worker's device (engine/mamba2_backend.h).
// With a worker tree, the parameters come down it and the finite partials go up it as
// Mamba-1's (engine/reduce_groups.h names a Mamba-2 layer's group by its own tensors).
#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/span_tensors.h"
#include "proto/span_kind.h"
#include "worker/task_runner.h"

namespace adjsh::worker {
TaskRunner::Outcome TaskRunner::RunMamba2(const v1::Task& task, const TaskState& held,
                                          SpanStore::Job& job) {
  const std::string& tid = task.task_id();
  auto skip = [&](absl::string_view why) {
    return End(tid, NoResult{.skipped = true, .why = std::string(why)});
  };
  const Mamba2Config& cfg = *job.mamba2;
  // What the device lacks, refused before the model or the span is fetched.
  if (absl::Status st = CheckMamba2Backend(*backend_, task.masked()); !st.ok())
    return skip(st.message());
  const bool tree = task.has_tree();
  if (tree) {
    if (std::optional<std::string> why = EnterTree(task, job)) return skip(*why);
  }
  const SpanPhase phase = *PhaseOf(task.kind());  // Run checked it
  const SpanPlan& plan = *job.plans.at(task.sequence());
  const std::pair<int64_t, int64_t> key{task.sequence(), task.span()};
  const SpanTask span_task{phase, task.layer(), task.span()};
  const int64_t id = plan.Id(span_task.phase, span_task.layer, span_task.span);
  if (id < 0) return skip("the plan has no such task");
  auto owned = job.mamba2_spans.find(key);
  const bool need_params = job.mamba2_params == nullptr;
  const bool include_params = need_params && !tree;
  const bool include_span = owned == job.mamba2_spans.end() || !owned->second->Ready(span_task);
  // The model of the task's version, from named tensors.
  auto take_model = [&](const TensorMap& named) -> absl::Status {
    absl::StatusOr<Mamba2Params<float>> params = Mamba2ParamsFromTensors<float>(cfg, named);
    if (!params.ok()) return params.status();
    job.mamba2_spans.clear();  // they point into the model being replaced
    owned = job.mamba2_spans.end();
    job.mamba2_model.reset();
    job.mamba2_params = std::make_unique<Mamba2Params<float>>(*std::move(params));
    absl::StatusOr<Mamba2BackendModel<float>> model =
        Mamba2BackendModel<float>::Make(*job.mamba2_params, *backend_);
    if (!model.ok()) {
      job.mamba2_params.reset();
      return model.status();
    }
    job.mamba2_model = std::make_unique<Mamba2BackendModel<float>>(*std::move(model));
    return absl::OkStatus();
  };
  TensorMap got;
  if (need_params && tree) {  // kept at once: a later failure of this task does not refetch
    TensorMap named;
    if (std::optional<NoResult> no = TreeParams(held, task, Mamba2ParamBytesF32(cfg),
                                                16 * cfg.num_hidden_layers + 64, named))
      return End(tid, *no);
    if (absl::Status st = take_model(named); !st.ok())
      return skip(absl::StrCat("parameters: ", st.message()));
  }
  if (std::optional<NoResult> no = io_.Fetch(held, include_params, include_span,
                                             SpanInputLimits(cfg.num_hidden_layers,
                                                             cfg.hidden_size,
                                                             cfg.inner() * cfg.state_size,
                                                             cfg.conv_kernel,
                                                             Mamba2ParamBytesF32(cfg), plan,
                                                             task.span()),
                                             got)) {
    return End(tid, *no);
  }
  for (const auto& [name, tensor] : got) bytes_received_ += tensor.data.size();
  if (include_params) {
    if (absl::Status st = take_model(TakeParamTensors(got)); !st.ok())
      return skip(absl::StrCat("parameters: ", st.message()));
  }
  if (job.mamba2_params == nullptr) return skip("the parameters were not sent");

  const Clock::time_point started = Clock::now();
  double rebuild_s = 0;
  if (include_span) {  // a fresh span, replayed up to this task
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;
    if (absl::Status st = TakeSpanStart(cfg, plan, task.span(), task.masked(), got, tokens, mask);
        !st.ok())
      return skip(st.message());
    auto work = std::make_unique<Mamba2SpanWork<float>>(
        *job.mamba2_model, plan, task.span(), std::move(tokens), std::move(mask),
        task.targets(), task.storage() == "bf16" ? Storage::kBF16 : Storage::kCompute,
        opt_.spill_dir);
    for (int64_t r : plan.ReplayIds(id)) {
      absl::StatusOr<SpanInputs<float>> in =
          TakeSpanInputs<float>(cfg, plan, plan.task(r), ReplayPrefix(plan.task(r)), got);
      if (!in.ok()) return skip(absl::StrCat("replay: ", in.status().message()));
      Mamba2SpanOutputs<float> discard;
      if (absl::Status st = work->Run(plan.task(r), *in, discard); !st.ok())
        return skip(st.message());
    }
    job.mamba2_spans[key] = std::move(work);
    rebuild_s = NoteRebuild(task, plan, id, started);
  }
  absl::StatusOr<SpanInputs<float>> in = TakeSpanInputs<float>(cfg, plan, span_task, "", got);
  if (!in.ok()) return skip(in.status().message());
  if (!got.empty()) return skip(absl::StrCat("unexpected tensor \"", got.begin()->first, "\""));

  std::string why;
  if (!state_.TaskAlive(held, &why)) return End(tid, NoResult{.skipped = false, .why = why});
  if (state_.Stopping()) return End(tid, NoResult{.skipped = false, .why = "stopping"});

  Mamba2SpanWork<float>& work = *job.mamba2_spans.at(key);
  const Clock::time_point computing = rebuild_s > 0 ? Clock::now() : started;
  SpanResultOf<float, Mamba2Config> result;
  if (absl::Status st = work.Run(span_task, *in, result.out); !st.ok()) return skip(st.message());
  result.compute_seconds = std::chrono::duration<double>(Clock::now() - computing).count();
  result.rebuild_seconds = rebuild_s;
  rows_ = plan.range(task.span()).len;
  // The span's last task: its rows are of no more use.
  if (span_task.phase == SpanPhase::kBackward && span_task.layer == 0)
    job.mamba2_spans.erase(key);
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

}  // namespace adjsh::worker
