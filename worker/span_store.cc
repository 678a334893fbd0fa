#include "worker/span_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/mamba2_config.h"
#include "common/strings.h"

namespace adjsh::worker {

absl::StatusOr<SpanPlan> CheckTask(const v1::Task& task, int64_t K, int64_t W) {
  if (task.layer() < 0 || task.layer() >= K) {
    return absl::InvalidArgumentError(absl::StrFormat("layer %d outside 0..%d", task.layer(), K - 1));
  }
  if (task.context_length() < 2 || task.chunk() < 1 || task.spans() < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad step shape: context %d, chunk %d, spans %d", task.context_length(), task.chunk(),
        task.spans()));
  }
  if (task.span() < 0 || task.span() >= task.spans()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("span %d outside 0..%d", task.span(), task.spans() - 1));
  }
  if (task.targets() < 1 || task.targets() >= task.context_length()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d targets for a context of %d tokens", task.targets(), task.context_length()));
  }
  const int64_t sequences = std::max<int64_t>(1, task.sequences());
  if (task.sequence() < 0 || task.sequence() >= sequences) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence %d outside 0..%d", task.sequence(), sequences - 1));
  }
  if (task.storage() != "full" && task.storage() != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrFormat("storage '%s' is neither full nor bf16", Echo(task.storage())));
  }
  if (task.dtype() != v1::F32) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "compute dtype %s: workers compute in F32", v1::DType_Name(task.dtype())));
  }
  return SpanPlan::Make(task.context_length(), task.chunk(), task.spans(), K, W,
                        task.forward_only());
}

absl::StatusOr<SpanStore::Job*> SpanStore::JobFor(const v1::Task& task) {
  auto it = jobs_.find(task.job_id());
  if (it != jobs_.end() && task.params_version() < it->second.version) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "a task of parameter version %d after version %d", task.params_version(),
        it->second.version));
  }
  if (it == jobs_.end() || it->second.config_json != task.config_json()) {
    const std::string_view text = ToStd(task.config_json());
    absl::StatusOr<std::string> type = ModelTypeOf(text);
    if (!type.ok()) return type.status();
    Job fresh;
    fresh.config_json = task.config_json();
    // The config's family, and its part of the job.
    if (absl::Status s = VisitFamily(ModelTypeOfName(*type), [&](auto family) -> absl::Status {
          using F = decltype(family);
          absl::StatusOr<typename F::Config> config = F::ParseConfig(text);
          if (!config.ok()) return config.status();
          JobModel<F> m;
          m.config = std::make_shared<const typename F::Config>(*config);
          fresh.groups = std::make_shared<const GroupLayout>(GroupLayout::Of(*config));
          fresh.model = std::move(m);
          return absl::OkStatus();
        });
        !s.ok())
      return s;
    fresh.version = task.params_version();
    // The old job goes whole first: its spans before the model and the plans they point into.
    if (it != jobs_.end()) jobs_.erase(it);
    it = jobs_.emplace(task.job_id(), std::move(fresh)).first;
  }
  Job& job = it->second;
  absl::StatusOr<SpanPlan> plan = std::visit(
      [&task](const auto& m) {
        return CheckTask(task, m.config->num_hidden_layers, m.config->conv_kernel);
      },
      job.model);
  if (!plan.ok()) return plan.status();
  if (task.params_version() > job.version) {
    std::visit([](auto& m) { m.DropModel(); }, job.model);
    job.plans.clear();
    job.version = task.params_version();
  }
  const int64_t b = task.sequence();
  const auto held = job.plans.find(b);
  const bool same_plan = held != job.plans.end() && held->second->T() == task.context_length() &&
                         held->second->chunk() == std::min(task.chunk(), task.context_length()) &&
                         held->second->spans() == task.spans() &&
                         held->second->forward_only() == task.forward_only();
  if (!same_plan) {
    job.DropSpans(b);  // the sequence's spans belong to the plan replaced
    job.plans[b] = std::make_unique<SpanPlan>(*std::move(plan));
  }
  job.last_used = ++clock_;
  while (jobs_.size() > static_cast<size_t>(max_jobs_)) {
    auto oldest = jobs_.begin();
    for (auto j = jobs_.begin(); j != jobs_.end(); ++j)
      if (j->second.last_used < oldest->second.last_used) oldest = j;
    jobs_.erase(oldest);  // never `it`: it was just used
  }
  return &job;
}

int64_t SpanStore::kept_bytes() const {
  int64_t b = 0;
  for (const auto& [id, job] : jobs_)
    b += std::visit([](const auto& m) { return m.kept_bytes(); }, job.model);
  return b;
}

}  // namespace adjsh::worker
