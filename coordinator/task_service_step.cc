// The TaskService's steps (coordinator/task_service.h): a gradient's sequences and their
// schedulers, its beginning with the live workers (owners, the worker tree), its restart when
// a tree worker is lost, its end (result, trace, cancel, abort). The RPCs that serve its tasks
// are in coordinator/task_service.cc (workers, leases), task_service_inputs.cc (the tensors
// streamed out) and task_service_results.cc (the results taken in).
#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/mamba2_config.h"
#include "common/model.h"
#include "coordinator/task_service.h"
#include "engine/families/families.h"
#include "engine/capabilities.h"
#include "common/mamba2_model.h"

namespace adjsh::coordinator {

int64_t TaskServiceImpl::Step::SequenceOf(int64_t id) const {
  return static_cast<int64_t>(std::upper_bound(first.begin(), first.end(), id) - first.begin()) -
         1;
}

SpanScheduler& TaskServiceImpl::Step::Locate(int64_t id, int64_t* local) const {
  const int64_t b = SequenceOf(id);
  *local = id - first[b];
  return *seqs[b];
}

bool TaskServiceImpl::Step::Done() const {
  for (const auto& s : seqs)
    if (!s->Done()) return false;
  return true;
}

QueueStats TaskServiceImpl::Step::Stats() const {
  QueueStats t;
  for (const auto& seq : seqs) {
    const QueueStats s = seq->queue().Stats();
    t.total += s.total, t.waiting += s.waiting, t.ready += s.ready, t.leased += s.leased;
    t.done += s.done;
    AddLeaseCounters(s, t);
  }
  return t;
}

template <typename Params>
absl::StatusOr<TaskServiceImpl::Sequences> TaskServiceImpl::MakeSchedulers(
    const Params& params, std::span<const GradPiece> pieces) {
  Sequences out;
  out.first.push_back(0);
  for (const GradPiece& p : pieces) {
    absl::StatusOr<std::unique_ptr<SpanScheduler>> sched =
        SpanScheduler::Make(params, p.tokens, p.options);
    if (!sched.ok()) return sched.status();
    out.first.push_back(out.first.back() + (*sched)->plan().num_tasks());
    out.seqs.push_back(*std::move(sched));
  }
  return out;
}

absl::StatusOr<GradResult<float>> TaskServiceImpl::ComputeGradient(
    const ModelParams<float>& params, std::span<const uint32_t> tokens, const GradOptions& options,
    const std::string& job_id, int64_t step_index) {
  const GradPiece piece{tokens, options};
  absl::StatusOr<std::vector<GradResult<float>>> r =
      ComputeGradients(params, std::span(&piece, 1), job_id, step_index);
  if (!r.ok()) return r.status();
  return std::move(r->front());
}

absl::StatusOr<std::vector<GradResult<float>>> TaskServiceImpl::ComputeGradients(
    const ModelParams<float>& params, std::span<const GradPiece> pieces, const std::string& job_id,
    int64_t step_index) {
  return RunStep<ModelParams>(params, pieces, job_id, step_index);
}

absl::StatusOr<Mamba2GradResult<float>> TaskServiceImpl::ComputeGradient(
    const Mamba2Params<float>& params, std::span<const uint32_t> tokens,
    const GradOptions& options, const std::string& job_id, int64_t step_index) {
  const GradPiece piece{tokens, options};
  absl::StatusOr<std::vector<Mamba2GradResult<float>>> r =
      ComputeGradients(params, std::span(&piece, 1), job_id, step_index);
  if (!r.ok()) return r.status();
  return std::move(r->front());
}

absl::StatusOr<std::vector<Mamba2GradResult<float>>> TaskServiceImpl::ComputeGradients(
    const Mamba2Params<float>& params, std::span<const GradPiece> pieces,
    const std::string& job_id, int64_t step_index) {
  return RunStep<Mamba2Params>(params, pieces, job_id, step_index);
}

template <template <typename> class P>
absl::StatusOr<std::vector<GradResult<float, P>>> TaskServiceImpl::RunStep(
    const P<float>& params, std::span<const GradPiece> pieces, const std::string& job_id,
    int64_t step_index) {
  if (pieces.empty()) return absl::InvalidArgumentError("no sequence to compute a gradient of");
  for (size_t b = 0; b < pieces.size(); ++b) {
    const GradOptions& options = pieces[b].options;
    auto in_sequence = [&](const absl::Status& s) {
      if (pieces.size() == 1) return s;
      return absl::Status(s.code(), absl::StrCat("sequence ", b, " of the step: ", s.message()));
    };
    if (absl::Status s = Supports({.model = FamilyOf<P<float>>::kType,
                                   .runner = Runner::kWorkers,
                                   .options = options},
                                  Naming::kSpecField);
        !s.ok())
      return in_sequence(s);
    if (absl::Status s = ValidateGradientInputs(params.config, pieces[b].tokens, options); !s.ok())
      return in_sequence(s);
    if (options.forward_only != pieces[0].options.forward_only) {
      return absl::InvalidArgumentError(
          "the sequences of one step are all evaluations (forward_only) or none");
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.ok()) return aborted_;
    running_ = true;  // from here on a CancelCurrent applies to this gradient
    cancelled_ = false;
  }
  auto step = std::make_unique<Step>();
  try {  // an allocation failure here ends this gradient (and its job), not the service
    step->pieces.assign(pieces.begin(), pieces.end());
    absl::StatusOr<Sequences> made = MakeSchedulers(params, step->pieces);
    if (!made.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      return made.status();
    }
    step->seqs = std::move(made->seqs);
    step->first = std::move(made->first);
    step->params = &params;
    step->config_json = FamilyOf<P<float>>::ConfigJson(params.config);
    step->job_id = job_id;
    step->step = step_index;
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    throw;
  }
  std::unique_lock<std::mutex> lock(mu_);
  step->version = ++next_version_;
  step->wire_at_start = bytes_sent_.load() + bytes_received_.load();
  if (!cancelled_ && aborted_.ok()) {
    current_ = std::move(step);
    BeginStep();
    work_cv_.notify_all();
    // Woken by results and roots; and a few times a lease, to notice a lost tree worker when
    // nobody pulls.
    const auto tick = std::max(std::chrono::milliseconds(20),
                               absl::ToChronoMilliseconds(opt_.lease) / 4);
    while (!(cancelled_ || !aborted_.ok() || current_->Done())) {
      done_cv_.wait_for(lock, tick);
      if (!cancelled_ && aborted_.ok() && current_) RestartIfTreeLost();
    }
  }
  running_ = false;
  if (!aborted_.ok()) {
    RetireStep();
    current_.reset();  // Abort already withdrew it
    return aborted_;
  }
  if (cancelled_) {
    RetireStep();
    current_.reset();  // CancelCurrent already withdrew it; nothing of it is applied now
    return absl::CancelledError("the gradient was cancelled");
  }
  // The step's wire bytes go to its first sequence's profile (a combination adds them up).
  const uint64_t wire = bytes_sent_.load() + bytes_received_.load() - current_->wire_at_start;
  std::vector<GradResult<float, P>> results;
  for (size_t b = 0; b < current_->seqs.size(); ++b) {
    results.push_back(current_->seqs[b]->template Finish<P>(b == 0 ? wire : 0));
    results.back().profile.tree_workers = static_cast<int64_t>(current_->tree_workers.size());
    results.back().profile.restarts = current_->restarts;
  }
  // The trace is of one sequence's gradient steps (bench/fleet_sim.py); an evaluation's is
  // not written, nor is a batch's.
  if (!opt_.trace_path.empty() && !current_->pieces[0].options.forward_only &&
      current_->seqs.size() == 1)
    WriteTrace(*current_);
  RetireStep();
  current_.reset();
  return results;
}

void TaskServiceImpl::BeginStep() {
  Step& step = *current_;
  for (auto& [id, worker] : workers_) worker.leases.clear();  // of earlier versions
  if (step.job_id != skips_job_) {  // a worker unable to run one job's tasks may run another's
    for (auto& [id, worker] : workers_) worker.skipped_tasks = 0;
    skips_job_ = step.job_id;
  }
  const std::vector<std::string> live = LiveWorkers();
  int64_t spans = 0;
  for (const auto& seq : step.seqs) spans += seq->plan().spans();
  DealSpans(owners_, step.job_id, spans, live);
  for (int64_t b = 0, base = 0; b < static_cast<int64_t>(step.seqs.size()); ++b) {
    step.seqs[b]->Begin(owners_, base);
    base += step.seqs[b]->plan().spans();
  }
  step.tree.Clear();
  step.tree_workers.clear();
  // A forward-only step (evaluation) has no partials to reduce: never a tree. Nor has a step
  // of several sequences (the tree sums the partials of one). Either model type's step may
  // have one (engine/reduce_groups.h).
  if (!opt_.worker_tree || step.star_only || live.empty() || step.seqs.size() != 1 ||
      step.seqs[0]->plan().forward_only())
    return;
  // A tree needs every span owned by a worker that serves a peer endpoint.
  std::map<std::string, int32_t> index;
  for (const std::string& o : owners_.owner) {
    const auto w = workers_.find(o);
    if (o.empty() || w == workers_.end() || w->second.peer_address.empty()) return;
    if (index.emplace(o, static_cast<int32_t>(step.tree_workers.size())).second)
      step.tree_workers.push_back(o);
  }
  std::vector<std::string> members = step.tree_workers;
  std::sort(members.begin(), members.end());
  if (members == broken_tree_) {  // these workers' tree lost its roots before: the star
    step.tree_workers.clear();
    return;
  }
  for (const std::string& o : owners_.owner) step.tree.add_span_owner(index.at(o));
  for (const std::string& id : step.tree_workers) step.tree.add_peer(workers_.at(id).peer_address);
  step.seqs[0]->ReduceAmongWorkers();
}

absl::Duration TaskServiceImpl::RootsDeadline(absl::Duration lease, uint64_t param_bytes,
                                              size_t tree_workers) {
  int levels = 1;
  for (size_t w = 1; w < tree_workers; w *= 2) ++levels;
  return kRootsDeadlineLeases * lease +
         absl::Seconds(levels * static_cast<double>(param_bytes) / kSlowTreeBytesPerSecond);
}

void TaskServiceImpl::RestartIfTreeLost() {
  if (!current_ || current_->tree_workers.empty() || current_->Done()) return;
  const absl::Time now = absl::Now(), since = now - opt_.lease;
  std::string lost;
  for (const std::string& id : current_->tree_workers) {
    const auto w = workers_.find(id);
    if (w == workers_.end() || !Live(w->second, since)) {
      lost = w == workers_.end() || w->second.name.empty() ? id : w->second.name;
      break;
    }
  }
  // Every task done, every worker live, and still roots missing: a sum that cannot get
  // through (a peer unreachable from another, a refused push). Again, through the coordinator.
  bool roots_stuck = false;
  if (lost.empty()) {
    if (!current_->seqs[0]->queue().Finished()) return;
    if (current_->tasks_done_at == absl::InfiniteFuture()) current_->tasks_done_at = now;
    const uint64_t bytes = std::visit(
        [](auto* p) { return FamilyOf<std::remove_cvref_t<decltype(*p)>>::ParamBytes(p->config); },
        current_->params);
    if (now - current_->tasks_done_at <
        RootsDeadline(opt_.lease, bytes, current_->tree_workers.size()))
      return;
    roots_stuck = true;
  }
  // New schedulers of the step's model type.
  absl::StatusOr<Sequences> made = std::visit(
      [&](auto* p) { return MakeSchedulers(*p, current_->pieces); }, current_->params);
  if (!made.ok()) {  // they were made once for these inputs: not expected
    aborted_ = made.status();
    done_cv_.notify_all();
    return;
  }
  RetireStep();  // the old schedulers' lease counters, before they go
  current_->seqs = std::move(made->seqs);
  current_->first = std::move(made->first);
  current_->version = ++next_version_;
  current_->lease_secrets.clear();
  current_->leased_at.clear();
  current_->fetched.clear();
  ++restarts_;
  ++current_->restarts;
  current_->tasks_done_at = absl::InfiniteFuture();
  if (roots_stuck) {
    current_->star_only = true;
    broken_tree_ = current_->tree_workers;  // not again with the same workers
    std::sort(broken_tree_.begin(), broken_tree_.end());
    std::fprintf(stderr,
                 "adjsh coordinator: step %lld's tasks are done but roots of its worker tree "
                 "did not come within %s of its last task: the step begins again, reduced "
                 "through the coordinator (as every step is while these workers stay the "
                 "same)\n",
                 static_cast<long long>(current_->step),
                 absl::FormatDuration(now - current_->tasks_done_at).c_str());
  } else {
    std::fprintf(stderr,
                 "adjsh coordinator: worker %s of step %lld's tree is lost, and the sums it "
                 "held with it: the step begins again\n",
                 lost.c_str(), static_cast<long long>(current_->step));
  }
  BeginStep();
  work_cv_.notify_all();
}

void TaskServiceImpl::WriteTrace(const Step& step) {
  const SpanScheduler& seq = *step.seqs[0];
  const absl::Status s = AppendTrace(opt_.trace_path, seq.plan(), step.step, seq.records());
  if (!s.ok()) std::fprintf(stderr, "adjsh coordinator: %s\n", std::string(s.message()).c_str());
}

void TaskServiceImpl::CancelCurrent() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!running_) return;
  cancelled_ = true;
  RetireStep();
  current_.reset();  // the RPCs see no step from now on: no task handed out or accepted
  done_cv_.notify_all();
  work_cv_.notify_all();
}

void TaskServiceImpl::Abort(absl::Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (why.ok() || !aborted_.ok()) return;  // the first reason stays
  aborted_ = std::move(why);
  RetireStep();
  current_.reset();  // the RPCs see no step from now on
  done_cv_.notify_all();
  work_cv_.notify_all();
}

void TaskServiceImpl::RetireStep() {
  if (!current_) return;
  AddLeaseCounters(current_->Stats(), past_);
}

}  // namespace adjsh::coordinator
