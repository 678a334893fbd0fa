// The coordinator's Prometheus metrics (served by `adjsh coordinator --metrics-listen HOST:PORT`
// and `adjsh train [--workers N] --metrics-listen HOST:PORT`; in-process without the task
// families).
//
//   adjsh_coordinator_tasks{state}                      span tasks of the gradient being
//                                                       computed: waiting, ready, leased, done
//   adjsh_coordinator_leases_granted_total              task leases handed out
//   adjsh_coordinator_leases_expired_total              leases that ran out (a lost or slow
//                                                       worker; the task was handed out again)
//   adjsh_coordinator_leases_released_total             leases given back (worker shutting down)
//   adjsh_coordinator_results_accepted_total            task results applied (once per task)
//   adjsh_coordinator_results_rejected_total            late, duplicate or stale results
//   adjsh_coordinator_sent_bytes_total                  tensor bytes streamed to workers
//   adjsh_coordinator_received_bytes_total              tensor bytes received from workers
//   adjsh_coordinator_workers_connected                 workers heard from within a lease
//   adjsh_coordinator_span_rebuilds_total               span tasks whose worker rebuilt the
//                                                       span first (a new owner after a loss)
//   adjsh_coordinator_step_restarts_total               steps begun again after losing a
//                                                       worker of their worker tree
//   adjsh_coordinator_tree_roots_total                  group roots received from worker trees
//   adjsh_coordinator_step_task_seconds                 last step: compute time of its tasks
//   adjsh_coordinator_step_critical_path_seconds        last step: longest dependent chain
//   adjsh_coordinator_step_parallelism                  last step: the two above's ratio
//   adjsh_coordinator_step_wire_bytes                   last step: tensor bytes in and out
//   adjsh_coordinator_jobs{state}                       jobs by state (adjsh coordinator only):
//                                                       queued, running, succeeded, failed,
//                                                       cancelled
//   adjsh_coordinator_steps_total                       optimizer steps done
//   adjsh_coordinator_tokens_total                      tokens trained on (context per step)
//   adjsh_coordinator_step_duration_seconds             histogram: one optimizer step
//   adjsh_coordinator_resident_memory_bytes             VmRSS now
//   adjsh_coordinator_peak_resident_memory_bytes        VmHWM
// and, while a job runs (label job_id = its id; "train" under adjsh train; not "job", which
// Prometheus gives the scrape job):
//   adjsh_coordinator_job_step{job_id}                  steps done
//   adjsh_coordinator_job_steps{job_id}                 steps the job asks for
//   adjsh_coordinator_job_expected_workers{job_id}      workers the job expects (only when
//                                                       its spec states them; the worker
//                                                       shortfall alert)
//   adjsh_coordinator_loss{job_id}                      loss of the last step
//   adjsh_coordinator_tokens_per_second{job_id}         throughput of the last step
//   adjsh_coordinator_grad_norm{job_id}                 gradient norm of the last step
//   adjsh_coordinator_learning_rate{job_id}             learning rate of the last step
//   adjsh_coordinator_val_loss{job_id}                  held-out loss of the last evaluation
//   adjsh_coordinator_last_progress_timestamp_seconds{job_id}
//                                                       Unix time of the job's start or last
//                                                       step (the "step stalled" alert)
#ifndef ADJSH_COORDINATOR_METRICS_H_
#define ADJSH_COORDINATOR_METRICS_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/metrics_server.h"
#include "coordinator/job_observer.h"
#include "coordinator/job_service.h"
#include "coordinator/task_service.h"
#include "prometheus/collectable.h"
#include "prometheus/histogram.h"

namespace adjsh::coordinator {

class CoordinatorMetrics final : public prometheus::Collectable, public JobObserver {
 public:
  // tasks: the TaskService the workers talk to; it must outlive this object's use by the
  // metrics server. nullptr: in-process training (adjsh train without --workers), whose
  // metrics have no task, lease, result, wire or worker families.
  explicit CoordinatorMetrics(const TaskServiceImpl* tasks);
  // The JobService whose jobs are counted (adjsh_coordinator_jobs); without one (adjsh train)
  // that family is not exported. Set it before the metrics are served; it must outlive them.
  void set_jobs(const JobServiceImpl* jobs) { jobs_ = jobs; }

  void JobStarted(const std::string& job_id, int64_t step, int64_t steps,
                  int64_t expected_workers) override;
  void StepDone(const std::string& job_id, const train::StepReport& report,
                int64_t tokens) override;
  void JobEnded(const std::string& job_id) override;

  std::vector<prometheus::MetricFamily> Collect() const override;

  // Every metric this class can export.
  static const std::vector<metrics::MetricDef>& Definitions();

 private:
  const TaskServiceImpl* tasks_;
  const JobServiceImpl* jobs_ = nullptr;
  mutable std::mutex mu_;
  int64_t steps_ = 0, tokens_ = 0;  // guarded by mu_
  StepProfile profile_;             // the newest step's (tasks = 0: none yet); guarded by mu_
  // The running job, if any (guarded by mu_).
  bool running_ = false;
  std::string job_;
  int64_t job_step_ = 0, job_steps_ = 0, expected_workers_ = 0;
  double loss_ = 0, tokens_per_s_ = 0, last_progress_ = 0, grad_norm_ = 0, lr_ = 0;
  double val_loss_ = 0;
  bool stepped_ = false;    // loss, tokens/s, grad norm and learning rate are known
  bool evaluated_ = false;  // a held-out loss is known
  prometheus::Histogram step_duration_;  // thread-safe itself
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_METRICS_H_
