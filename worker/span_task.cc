// TaskRunner::RunSpanTask (worker/task_runner.h): one span task of any model type
// (engine/families/family.h). The model of the task's version from named tensors (down the worker
// tree when the step has one, else with the task's inputs), the span rebuilt from its tokens
// and the ledger's replay when this worker does not hold it ready, the task run on the
// worker's backend, its finite partials given to the tree (or sent with the result), the
// result pushed.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/reduce_groups.h"
#include "engine/span_tensors.h"
#include "proto/span_kind.h"
#include "worker/task_runner.h"

namespace adjsh::worker {

template <typename F>
TaskRunner::Outcome TaskRunner::RunSpanTask(const v1::Task& task, const TaskState& held,
                                            SpanStore::Job& job, JobModel<F>& m) {
  using C = typename F::Config;
  using Params = typename F::template Params<float>;
  using Model = typename F::template Model<float>;
  using Work = typename F::template Work<float>;
  const std::string& tid = task.task_id();
  auto skip = [&](absl::string_view why) {
    return End(tid, NoResult{.skipped = true, .why = std::string(why)});
  };
  auto drop = [&](std::string why) {
    return End(tid, NoResult{.skipped = false, .why = std::move(why)});
  };
  const C& cfg = *m.config;
  // What the device lacks, refused before the model or the span is fetched.
  if (absl::Status st = F::CheckBackend(*backend_, cfg, task.masked()); !st.ok())
    return skip(st.message());
  const SpanPhase phase = *PhaseOf(task.kind());  // Run checked it
  const SpanPlan& plan = *job.plans.at(task.sequence());
  const std::pair<int64_t, int64_t> key{task.sequence(), task.span()};
  const SpanTask span_task{phase, task.layer(), task.span()};
  const int64_t id = plan.Id(span_task.phase, span_task.layer, span_task.span);
  if (id < 0) return skip("the plan has no such task");
  // The task's device traffic: its model's upload (a new version), its span's rebuild and its
  // compute, all on this thread (Backend::ThreadTraffic).
  const DeviceTraffic traffic_before = backend_->ThreadTraffic();
  auto& spans = m.spans;
  std::unique_ptr<Params>& params = m.params;
  std::unique_ptr<Model>& model = m.model;
  auto owned = spans.find(key);
  // With a worker tree the parameters come down the tree, and the partials go up it.
  const bool tree = task.has_tree();
  if (tree) {
    if (std::optional<std::string> why = EnterTree(task, job)) return skip(*why);
  }
  const bool need_params = model == nullptr;
  const bool include_params = need_params && !tree;
  const bool include_span = owned == spans.end() || !owned->second->Ready(span_task);

  // The model of the task's version, from named tensors, on the backend.
  auto take_model = [&](const TensorMap& named) -> absl::Status {
    absl::StatusOr<Params> read = F::FromTensors(cfg, named);
    if (!read.ok()) return read.status();
    spans.clear();  // they point into the model being replaced
    owned = spans.end();
    model.reset();
    params = std::make_unique<Params>(*std::move(read));
    // Resident on a GPU unless the job's rows are rounded to bf16 or the worker spills them.
    const RowPlace place = task.storage() != "bf16" && opt_.spill_dir.empty() ? RowPlace::kResident
                                                                              : RowPlace::kHost;
    absl::StatusOr<Model> made = F::MakeModel(*params, *backend_, place);
    if (!made.ok()) {
      params.reset();
      return made.status();
    }
    model = std::make_unique<Model>(*std::move(made));
    return absl::OkStatus();
  };
  TensorMap got;
  if (need_params && tree) {  // kept at once: a later failure of this task does not refetch
    TensorMap named;
    // At most every layer's tensors, the embedding, norm_f and an untied LM head.
    const int64_t max_tensors =
        static_cast<int64_t>(F::template LayerSlots<float>().size()) * cfg.num_hidden_layers + 3;
    if (std::optional<NoResult> no =
            TreeParams(held, task, F::ParamBytes(cfg), max_tensors, named))
      return End(tid, *no);
    if (absl::Status st = take_model(named); !st.ok())
      return skip(absl::StrCat("parameters: ", st.message()));
  }
  if (std::optional<NoResult> no = io_.Fetch(held, include_params, include_span,
                                             SpanInputLimits(cfg.num_hidden_layers,
                                                             cfg.hidden_size,
                                                             cfg.inner() * cfg.state_size,
                                                             cfg.conv_kernel, F::ParamBytes(cfg),
                                                             plan, task.span()),
                                             got)) {
    return End(tid, *no);
  }
  for (const auto& [name, tensor] : got) bytes_received_ += tensor.data.size();
  if (include_params) {
    if (absl::Status st = take_model(TakeParamTensors(got)); !st.ok())
      return skip(absl::StrCat("parameters: ", st.message()));
  }
  if (model == nullptr) return skip("the parameters were not sent");

  const Clock::time_point started = Clock::now();
  double rebuild_s = 0;
  if (include_span) {  // a fresh span, replayed up to this task
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;
    if (absl::Status st = TakeSpanStart(cfg, plan, task.span(), task.masked(), got, tokens, mask);
        !st.ok())
      return skip(st.message());
    auto work = std::make_unique<Work>(
        *model, plan, task.span(), std::move(tokens), std::move(mask), task.targets(),
        task.storage() == "bf16" ? Storage::kBF16 : Storage::kCompute, opt_.spill_dir);
    for (int64_t r : plan.ReplayIds(id)) {
      absl::StatusOr<SpanInputs<float>> in =
          TakeSpanInputs<float>(cfg, plan, plan.task(r), ReplayPrefix(plan.task(r)), got);
      if (!in.ok()) return skip(absl::StrCat("replay: ", in.status().message()));
      // What a replayed task returns is dropped: its partials stay where they were made.
      typename F::template Outputs<float> discard;
      if (absl::Status st = work->Run(plan.task(r), *in, discard, Partials::kDevice); !st.ok())
        return skip(st.message());
    }
    spans[key] = std::move(work);
    rebuild_s = NoteRebuild(task, plan, id, started);
  }
  absl::StatusOr<SpanInputs<float>> in = TakeSpanInputs<float>(cfg, plan, span_task, "", got);
  if (!in.ok()) return skip(in.status().message());
  if (!got.empty()) return skip(absl::StrCat("unexpected tensor \"", got.begin()->first, "\""));

  std::string why;
  if (!state_.TaskAlive(held, &why)) return drop(why);
  if (state_.Stopping()) return drop("stopping");

  Work& work = *spans.at(key);
  const Clock::time_point computing = rebuild_s > 0 ? Clock::now() : started;
  SpanResultOf<float, C> result;
  // A resident model's partials stay on the device for the tree to sum there
  // (engine/tree_reduce.h): only the nodes that leave this worker come down.
  const Partials partials = tree ? Partials::kDeviceChecked : Partials::kHost;
  if (absl::Status st = work.Run(span_task, *in, result.out, partials); !st.ok())
    return skip(st.message());
  // With a tree, finite partials become leaves of it here; non-finite ones travel in the
  // result (brought down for it), which the coordinator refuses as it would any.
  const bool finite = FirstNonFinite(result.out).empty();
  if (!finite) work.PartialsToHost(span_task.layer, result.out);
  result.compute_seconds = std::chrono::duration<double>(Clock::now() - computing).count();
  result.rebuild_seconds = rebuild_s;
  result.device = backend_->ThreadTraffic() - traffic_before;
  rows_ = plan.range(task.span()).len;
  // The span's last task: its rows are of no more use.
  if (span_task.phase == SpanPhase::kBackward && span_task.layer == 0) spans.erase(key);

  const bool leaves = tree && finite;
  if (leaves) {
    if (absl::Status st = peers_.AddLeaves(
            task, TakeLeaves(span_task, cfg.num_hidden_layers, result.out));
        !st.ok())
      return skip(st.message());
  }
  return PushResult(task, held, PutSpanResult<float>(cfg, plan, span_task, result, !leaves),
                    result.compute_seconds);
}

template TaskRunner::Outcome TaskRunner::RunSpanTask<Family<MambaConfig>>(
    const v1::Task&, const TaskState&, SpanStore::Job&, JobModel<Family<MambaConfig>>&);
template TaskRunner::Outcome TaskRunner::RunSpanTask<Family<Mamba2Config>>(
    const v1::Task&, const TaskState&, SpanStore::Job&, JobModel<Family<Mamba2Config>>&);

}  // namespace adjsh::worker
