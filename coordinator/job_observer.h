// What the JobService tells an observer (the coordinator's metrics, coordinator/metrics.h) about
// the running job. Called on the job runner's thread; an observer must not call back into the
// JobService and must be quick.
#ifndef ADJSH_COORDINATOR_JOB_OBSERVER_H_
#define ADJSH_COORDINATOR_JOB_OBSERVER_H_

#include <cstdint>
#include <string>

#include "train/trainer.h"

namespace adjsh::coordinator {

class JobObserver {
 public:
  virtual ~JobObserver() = default;
  // The job starts (or resumes) at `step` of `steps`, expecting `expected_workers` workers
  // (JobSpec.expected_workers; 0: none stated).
  virtual void JobStarted(const std::string& job_id, int64_t step, int64_t steps,
                          int64_t expected_workers) = 0;
  // A step of `tokens` tokens is done.
  virtual void StepDone(const std::string& job_id, const train::StepReport& report,
                        int64_t tokens) = 0;
  // The job ended (any way).
  virtual void JobEnded(const std::string& job_id) = 0;
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_JOB_OBSERVER_H_
