#include "coordinator/span_scheduler.h"

#include <algorithm>
#include <map>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "engine/span_tensors.h"

namespace adjsh::coordinator {
namespace {

// The most spans a worker takes: ceil(S / live workers), with at least one worker counted.
int64_t Quota(int64_t spans, int64_t live_workers) {
  const int64_t live = std::max<int64_t>(1, live_workers);
  return (spans + live - 1) / live;
}

}  // namespace

template <typename C>
absl::StatusOr<std::unique_ptr<SpanScheduler>> SpanScheduler::MakeFor(
    const C& c, std::span<const uint32_t> tokens, const GradOptions& options) {
  absl::StatusOr<SpanPlan> plan =
      SpanPlan::Make(static_cast<int64_t>(tokens.size()), options.chunk, options.spans,
                     c.num_hidden_layers, c.conv_kernel, options.forward_only);
  if (!plan.ok()) return plan.status();
  std::unique_ptr<SpanScheduler> s(new SpanScheduler());
  s->tokens_ = tokens;
  s->options_ = options;
  s->options_.progress = nullptr;
  s->plan_ = std::make_unique<SpanPlan>(*std::move(plan));
  s->queue_ = std::make_unique<TaskQueue>();
  for (int64_t id = 0; id < s->plan_->num_tasks(); ++id) {
    if (absl::Status st = s->queue_->AddTask(id, "", s->plan_->Dependencies(id)); !st.ok())
      return st;
  }
  s->records_.resize(s->plan_->num_tasks());
  return s;
}

template <typename Params>
absl::StatusOr<std::unique_ptr<SpanScheduler>> SpanScheduler::Make(
    const Params& params, std::span<const uint32_t> tokens, const GradOptions& options) {
  absl::StatusOr<std::unique_ptr<SpanScheduler>> s = MakeFor(params.config, tokens, options);
  if (!s.ok()) return s.status();
  (*s)->model_ = SequenceModel<FamilyOf<Params>>{
      &params,
      std::make_unique<LedgerOf<Params>>(params, *(*s)->plan_, tokens, options.loss_mask)};
  return s;
}

template absl::StatusOr<std::unique_ptr<SpanScheduler>> SpanScheduler::Make(
    const ModelParams<float>&, std::span<const uint32_t>, const GradOptions&);
template absl::StatusOr<std::unique_ptr<SpanScheduler>> SpanScheduler::Make(
    const Mamba2Params<float>&, std::span<const uint32_t>, const GradOptions&);

template <typename F>
decltype(auto) SpanScheduler::WithLedger(F&& f) const {
  return std::visit([&f](const auto& m) -> decltype(auto) { return f(*m.ledger, m.params->config); },
                    model_);
}

void SpanScheduler::ReduceAmongWorkers() {
  WithLedger([&](auto& ledger, const auto& c) {
    ledger.ReduceElsewhere();
    groups_ = std::make_unique<const GroupLayout>(GroupLayout::Of(c));
  });
}

bool SpanScheduler::Done() const {
  return queue_->Finished() &&
         (!among_workers() ||
          WithLedger([](const auto& ledger, const auto&) { return ledger.AllReduced(); }));
}

void DealSpans(SpanOwners& owners, const std::string& job_id, int64_t S,
               const std::vector<std::string>& live_workers) {
  if (owners.job_id != job_id || owners.spans != S ||
      static_cast<int64_t>(owners.owner.size()) != S) {
    owners.job_id = job_id;
    owners.spans = S;
    owners.owner.assign(S, "");
  }
  // Keep live owners, at most the quota each (their lowest spans), so a late worker gets its
  // share at the next step.
  const int64_t quota = Quota(S, static_cast<int64_t>(live_workers.size()));
  std::map<std::string, int64_t> held;
  for (int64_t s = 0; s < S; ++s) {
    std::string& o = owners.owner[s];
    if (o.empty()) continue;
    const bool alive = std::find(live_workers.begin(), live_workers.end(), o) != live_workers.end();
    if (!alive || ++held[o] > quota) o.clear();
  }
  // The spans nobody holds go round-robin to the live workers under their quota: span s to
  // the next one after span s - 1's. Interleaved, not in blocks: a span's forward waits for the
  // summaries of every span before it, and its backward for those after it, so neighbours on
  // different workers keep both busy instead of one waiting for the other's last summary.
  size_t next = 0;
  for (int64_t s = 0; s < S && !live_workers.empty(); ++s) {
    std::string& o = owners.owner[s];
    if (!o.empty()) continue;
    for (size_t tries = 0; tries < live_workers.size(); ++tries) {
      const std::string& w = live_workers[next++ % live_workers.size()];
      if (held[w] < quota) {
        o = w;
        ++held[w];
        break;
      }
    }
  }
}

void SpanScheduler::Begin(SpanOwners& owners, int64_t span_base) {
  owners_ = &owners;
  span_base_ = span_base;
  start_ = absl::Now();
}

std::optional<LeasedTask> SpanScheduler::NextOwned(const std::string& worker,
                                                   absl::Duration lease) {
  const std::vector<std::string>& owner = owners_->owner;
  auto own = [&](int64_t id) { return owner[span_base_ + plan_->task(id).span] == worker; };
  absl::StatusOr<LeaseResult> got = queue_->Lease(worker, lease, own);
  return got.ok() && got->task ? got->task : std::nullopt;
}

std::optional<LeasedTask> SpanScheduler::Claim(const std::string& worker, const Live& live,
                                               int64_t live_count, absl::Duration lease) {
  // The tree names the owners of this version: no claims (a lost one begins the step again,
  // coordinator/task_service.h).
  if (among_workers()) return std::nullopt;
  std::vector<std::string>& owner = owners_->owner;
  int64_t mine = 0;
  for (std::string& o : owner) {
    if (!o.empty() && o != worker && !live(o)) o.clear();  // lost: its spans are free
    mine += o == worker ? 1 : 0;
  }
  if (mine >= Quota(owners_->spans, live_count)) return std::nullopt;
  auto unowned = [&](int64_t id) { return owner[span_base_ + plan_->task(id).span].empty(); };
  absl::StatusOr<LeaseResult> got = queue_->Lease(worker, lease, unowned);
  if (!got.ok() || !got->task) return std::nullopt;
  owner[span_base_ + plan_->task(got->task->task_id).span] = worker;
  return got->task;
}

TensorMap SpanScheduler::Inputs(int64_t id, bool include_span) const {
  const SpanTask& task = plan_->task(id);
  TensorMap out;
  WithLedger([&](const auto& ledger, const auto& c) {
    PutSpanInputs<float>(c, *plan_, task, ledger.Inputs(id), "", out);
    if (include_span) {
      PutSpanStart(ledger.SpanTokens(task.span), ledger.SpanMask(task.span), out);
      for (const auto& [step, in] : ledger.Replay(id))
        PutSpanInputs<float>(c, *plan_, step, in, ReplayPrefix(step), out);
    }
  });
  return out;
}

absl::Status SpanScheduler::CheckResult(int64_t id, TensorMap& tensors, Result& out,
                                        std::string* nonfinite) const {
  const SpanTask& task = plan_->task(id);
  return WithLedger([&](const auto&, const auto& c) -> absl::Status {
    const bool partials = !among_workers() || HasPartials(c, *plan_, task, tensors);
    auto r = TakeSpanResult<float>(c, *plan_, task, tensors, partials);
    if (!r.ok()) return r.status();
    *nonfinite = FirstNonFinite(r->out);
    if (among_workers() && partials && nonfinite->empty()) {
      return absl::InvalidArgumentError(
          "the step reduces among the workers: a result carries its partials only when one of "
          "them is not finite");
    }
    out.rebuild_seconds = r->rebuild_seconds;
    out.value = *std::move(r);
    return absl::OkStatus();
  });
}

absl::Status SpanScheduler::SetReduced(int32_t group, TensorMap& tensors) {
  if (!among_workers()) {
    return absl::FailedPreconditionError("the step reduces through the coordinator");
  }
  absl::StatusOr<GroupValue<float>> v = TakeGroup(*groups_, group, tensors);
  if (!v.ok()) return v.status();
  return WithLedger([&](auto& ledger, const auto&) -> absl::Status {
    // A tied model's head and lookup roots, added by the worker that computed both.
    if (group == TiedEmbedGroup(groups_->K))
      return ledger.SetReducedTiedEmbed(std::move(v->at(0)));
    if (ledger.Reduced(group)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the ", GroupName(group, groups_->K), " group is reduced already"));
    }
    return ledger.SetReduced(group, *std::move(v));
  });
}

uint64_t SpanScheduler::GroupBytes(int32_t group) const {
  return among_workers() ? adjsh::GroupBytes(*groups_, group) : 0;
}

void SpanScheduler::Apply(int64_t id, Result&& result, const std::string& worker,
                          uint64_t bytes_in, uint64_t bytes_out, absl::Time leased) {
  TaskRecord& rec = records_[id];
  rec.start_s = absl::ToDoubleSeconds(leased - start_);
  rec.end_s = absl::ToDoubleSeconds(absl::Now() - start_);
  rec.rebuild_s = result.rebuild_seconds;
  rec.worker = worker;
  rec.bytes_in = bytes_in;
  rec.bytes_out = bytes_out;
  // CheckResult made the result of the sequence's model type.
  std::visit(
      [&](auto& m) {
        using C = std::remove_cvref_t<decltype(m.params->config)>;
        auto& r = std::get<SpanResultOf<float, C>>(result.value);
        rec.compute_s = r.compute_seconds;
        rec.device = r.device;
        m.ledger->Apply(id, std::move(r.out));
      },
      model_);
}

uint64_t SpanScheduler::MaxResultBytes(int64_t id) const {
  const uint64_t most = WithLedger([&](const auto&, const auto& c) {
    return SpanResultBytes(c, *plan_, plan_->task(id), 4);
  });
  return std::max<uint64_t>(2 * most, uint64_t{1} << 16);
}

template <template <typename> class P>
GradResult<float, P> SpanScheduler::Finish(uint64_t wire_bytes) {
  GradResult<float, P> r;
  auto* m = std::get_if<SequenceModel<FamilyOfParams<P>>>(&model_);
  ADJSH_CHECK(m != nullptr, "Finish of a sequence as another model type's");
  r = m->ledger->Finish();
  r.stored_bytes = m->ledger->held_bytes();
  r.profile =
      ProfileStep(*plan_, records_, wire_bytes, absl::ToDoubleSeconds(absl::Now() - start_));
  r.records = records_;
  return r;
}

template GradResult<float> SpanScheduler::Finish<ModelParams>(uint64_t);
template GradResult<float, Mamba2Params> SpanScheduler::Finish<Mamba2Params>(uint64_t);

}  // namespace adjsh::coordinator
