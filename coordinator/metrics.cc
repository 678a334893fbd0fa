#include "coordinator/metrics.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "common/proc_stats.h"

namespace adjsh::coordinator {
namespace {

using metrics::Kind;
using metrics::MetricDef;

enum Index {
  kTasks, kGranted, kExpired, kReleased, kAccepted, kRejected, kNonFinite, kSent, kReceived,
  kWorkers,
  kJobs, kSteps, kTokens, kStepDuration, kResident, kPeak,
  kJobStep, kJobSteps, kLoss, kTokensPerSecond, kLastProgress,
  kRebuilds, kRestarts, kRoots,
  kStepTaskSeconds, kStepCriticalPath, kStepParallelism, kStepWireBytes,
  kGradNorm, kLearningRate, kValLoss, kBuildInfo, kExpectedWorkers, kCount
};

const std::vector<MetricDef>& Table() {
  static const std::vector<MetricDef> table = {
      {"adjsh_coordinator_tasks", Kind::kGauge,
       "Tasks of the step being computed, by state."},
      {"adjsh_coordinator_leases_granted_total", Kind::kCounter, "Task leases handed out."},
      {"adjsh_coordinator_leases_expired_total", Kind::kCounter,
       "Task leases that ran out before a result; the task was handed out again."},
      {"adjsh_coordinator_leases_released_total", Kind::kCounter,
       "Task leases given back before a result."},
      {"adjsh_coordinator_results_accepted_total", Kind::kCounter, "Task results applied."},
      {"adjsh_coordinator_results_rejected_total", Kind::kCounter,
       "Task results refused: late, duplicate, of a finished step, or with non-finite values."},
      {"adjsh_coordinator_results_nonfinite_total", Kind::kCounter,
       "Task results refused for a NaN or Inf value (the task was handed out again)."},
      {"adjsh_coordinator_sent_bytes_total", Kind::kCounter, "Tensor bytes streamed to workers."},
      {"adjsh_coordinator_received_bytes_total", Kind::kCounter,
       "Tensor bytes received from workers."},
      {"adjsh_coordinator_workers_connected", Kind::kGauge,
       "Workers heard from within the last lease duration."},
      {"adjsh_coordinator_jobs", Kind::kGauge, "Jobs by state."},
      {"adjsh_coordinator_steps_total", Kind::kCounter, "Optimizer steps done."},
      {"adjsh_coordinator_tokens_total", Kind::kCounter, "Tokens trained on."},
      {"adjsh_coordinator_step_duration_seconds", Kind::kHistogram,
       "Time of one optimizer step (forward, backward on the workers, update)."},
      {"adjsh_coordinator_resident_memory_bytes", Kind::kGauge, "Resident set size (VmRSS)."},
      {"adjsh_coordinator_peak_resident_memory_bytes", Kind::kGauge,
       "Peak resident set size (VmHWM)."},
      {"adjsh_coordinator_job_step", Kind::kGauge, "Steps done by the running job."},
      {"adjsh_coordinator_job_steps", Kind::kGauge, "Steps the running job asks for."},
      {"adjsh_coordinator_loss", Kind::kGauge, "Loss of the running job's last step."},
      {"adjsh_coordinator_tokens_per_second", Kind::kGauge,
       "Throughput of the running job's last step."},
      {"adjsh_coordinator_last_progress_timestamp_seconds", Kind::kGauge,
       "Unix time of the running job's start or last step."},
      {"adjsh_coordinator_span_rebuilds_total", Kind::kCounter,
       "Span tasks whose worker rebuilt the span first (a new owner after a loss)."},
      {"adjsh_coordinator_step_restarts_total", Kind::kCounter,
       "Steps begun again after losing a worker of their worker tree."},
      {"adjsh_coordinator_tree_roots_total", Kind::kCounter,
       "Reduction group roots received from worker trees."},
      {"adjsh_coordinator_step_task_seconds", Kind::kGauge,
       "Last step: the workers' compute time summed over its span tasks."},
      {"adjsh_coordinator_step_critical_path_seconds", Kind::kGauge,
       "Last step: the longest chain of dependent span tasks, by their compute times."},
      {"adjsh_coordinator_step_parallelism", Kind::kGauge,
       "Last step: task seconds over critical path seconds (the workers it could keep busy)."},
      {"adjsh_coordinator_step_wire_bytes", Kind::kGauge,
       "Last step: tensor bytes in and out of the coordinator."},
      {"adjsh_coordinator_grad_norm", Kind::kGauge,
       "Global gradient norm of the running job's last step (before clipping)."},
      {"adjsh_coordinator_learning_rate", Kind::kGauge,
       "Learning rate of the running job's last step."},
      {"adjsh_coordinator_val_loss", Kind::kGauge,
       "Held-out loss of the running job's last evaluation."},
      {"adjsh_build_info", Kind::kGauge,
       "Always 1; labels: the component, the version, the source revision, CUDA built."},
      {"adjsh_coordinator_job_expected_workers", Kind::kGauge,
       "Workers the running job expects (its spec's expected_workers; absent when not stated)."},
  };
  return table;
}

double Now() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

double NonNegative(int64_t v) { return v > 0 ? static_cast<double>(v) : 0.0; }

}  // namespace

const std::vector<MetricDef>& CoordinatorMetrics::Definitions() { return Table(); }

CoordinatorMetrics::CoordinatorMetrics(const TaskServiceImpl* tasks)
    : tasks_(tasks),
      // 50 ms .. ~27 min, doubling: a small model's step to a 1M-token step.
      step_duration_(metrics::ExponentialBuckets(0.05, 2, 16)) {
  static_assert(kCount == 33, "one Index per table entry");
}

void CoordinatorMetrics::JobStarted(const std::string& job_id, int64_t step, int64_t steps,
                                    int64_t expected_workers) {
  std::lock_guard<std::mutex> lock(mu_);
  running_ = true;
  stepped_ = false;
  evaluated_ = false;
  job_ = job_id;
  job_step_ = step;
  job_steps_ = steps;
  expected_workers_ = expected_workers;
  last_progress_ = Now();
}

void CoordinatorMetrics::StepDone(const std::string& job_id, const train::StepReport& r,
                                  int64_t tokens) {
  step_duration_.Observe(r.seconds);
  std::lock_guard<std::mutex> lock(mu_);
  ++steps_;
  tokens_ += tokens;
  if (r.profile.tasks > 0) profile_ = r.profile;
  if (!running_ || job_ != job_id) return;
  stepped_ = true;
  job_step_ = r.step;
  loss_ = r.loss;
  tokens_per_s_ = r.tokens_per_s;
  grad_norm_ = r.grad_norm;
  lr_ = r.lr;
  if (r.evaluated) evaluated_ = true, val_loss_ = r.val_loss;
  last_progress_ = Now();
}

void CoordinatorMetrics::JobEnded(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (job_ == job_id) running_ = false;
}

std::vector<prometheus::MetricFamily> CoordinatorMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  auto add = [&](Index i, double value, const metrics::Labels& labels = {}) {
    out.push_back(metrics::Family(Table()[i]));
    metrics::AddSample(out.back(), value, labels);
  };
  if (tasks_ != nullptr) {  // the workers' side; none in-process
    const QueueStats q = tasks_->queue_stats();
    out.push_back(metrics::Family(Table()[kTasks]));
    for (const auto& [state, n] : {std::pair<const char*, int64_t>{"waiting", q.waiting},
                                   {"ready", q.ready}, {"leased", q.leased}, {"done", q.done}}) {
      metrics::AddSample(out.back(), static_cast<double>(n), {{"state", state}});
    }
    add(kGranted, static_cast<double>(q.leases_granted_total));
    add(kExpired, static_cast<double>(q.leases_expired_total));
    add(kReleased, static_cast<double>(q.leases_released_total));
    add(kAccepted, static_cast<double>(tasks_->results_accepted()));
    add(kRejected, static_cast<double>(tasks_->results_rejected()));
    add(kNonFinite, static_cast<double>(tasks_->results_nonfinite()));
    add(kSent, static_cast<double>(tasks_->bytes_sent()));
    add(kReceived, static_cast<double>(tasks_->bytes_received()));
    add(kWorkers, static_cast<double>(tasks_->worker_counts().connected));
    add(kRebuilds, static_cast<double>(tasks_->span_rebuilds()));
    add(kRestarts, static_cast<double>(tasks_->step_restarts()));
    add(kRoots, static_cast<double>(tasks_->roots_accepted()));
  }
  if (jobs_ != nullptr) {
    out.push_back(metrics::Family(Table()[kJobs]));
    for (const auto& [state, n] : jobs_->CountJobs()) {
      metrics::AddSample(out.back(), static_cast<double>(n),
                         {{"state", absl::AsciiStrToLower(v1::Job::State_Name(state))}});
    }
  }
  add(kBuildInfo, 1, metrics::BuildInfoLabels("coordinator"));
  add(kResident, NonNegative(ResidentBytes()));
  add(kPeak, NonNegative(PeakResidentBytes()));
  out.push_back(metrics::Family(Table()[kStepDuration]));
  metrics::AddHistogram(out.back(), step_duration_);
  std::lock_guard<std::mutex> lock(mu_);
  add(kSteps, static_cast<double>(steps_));
  add(kTokens, static_cast<double>(tokens_));
  if (profile_.tasks > 0) {  // the newest span-scheduled step's, kept after its job ends
    add(kStepTaskSeconds, profile_.task_seconds);
    add(kStepCriticalPath, profile_.critical_path_seconds);
    add(kStepParallelism, profile_.parallelism);
    add(kStepWireBytes, static_cast<double>(profile_.wire_bytes));
  }
  if (running_) {
    const metrics::Labels job = {{"job_id", job_}};
    add(kJobStep, static_cast<double>(job_step_), job);
    add(kJobSteps, static_cast<double>(job_steps_), job);
    add(kLastProgress, last_progress_, job);
    if (expected_workers_ > 0) add(kExpectedWorkers, static_cast<double>(expected_workers_), job);
    if (stepped_) {
      add(kLoss, loss_, job);
      add(kTokensPerSecond, tokens_per_s_, job);
      add(kGradNorm, grad_norm_, job);
      add(kLearningRate, lr_, job);
    }
    if (evaluated_) add(kValLoss, val_loss_, job);
  }
  return out;
}

}  // namespace adjsh::coordinator
