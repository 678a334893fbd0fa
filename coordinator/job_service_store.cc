// The JobService's job table on disk (coordinator/job_store.h, under state_dir/jobs): each
// job's record saved at every state change and checkpoint (Persist), and, when a coordinator
// starts with a state dir, the jobs a previous one recorded loaded again: ended ones kept for
// status and watch, queued and running ones queued again to resume from their checkpoints.
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/job_paths.h"
#include "coordinator/job_service.h"
#include "coordinator/job_spec.h"

namespace adjsh::coordinator {

void JobServiceImpl::Persist(const JobRecord& rec) {
  const absl::Status s = store_.Save({rec.job, rec.checkpoint_dir, rec.state_message});
  if (!s.ok()) {
    std::fprintf(stderr, "warning: job %s: cannot record its state (%s); it would not survive a "
                 "restart\n", rec.job.job_id().c_str(), std::string(s.message()).c_str());
  }
}

// The jobs a previous coordinator with this state dir recorded: ended ones kept for status and
// watch, queued and running ones queued again (in their order) to run from their checkpoints,
// unless this coordinator's roots or limits refuse their specs (then FAILED, naming why).
void JobServiceImpl::LoadStoredJobs() {
  std::vector<std::string> problems;
  for (StoredJob& j : store_.Load(&problems)) {
    auto rec = std::make_shared<JobRecord>();
    rec->job = std::move(j.job);
    rec->checkpoint_dir = std::move(j.checkpoint_dir);
    rec->state_message = std::move(j.state_message);
    const std::string& id = rec->job.job_id();
    int64_t n = 0;
    if (absl::SimpleAtoi(id.substr(4), &n) && n >= next_id_) next_id_ = n + 1;
    if (!Terminal(rec->job.state())) {
      // Checked again as at submit: this coordinator may have other roots or limits.
      v1::JobSpec spec = rec->job.spec();
      absl::Status fits = ConfineJobPaths(spec, {opt_.data_roots, opt_.state_dir});
      if (fits.ok()) fits = ValidateJobSpec(spec, opt_.limits);
      if (!fits.ok()) {
        SetState(*rec, v1::Job::FAILED,
                 absl::StrCat("refused when the coordinator started again: ", fits.ToString(),
                              "; submit it again to a coordinator that allows it (it resumes "
                              "from its checkpoints)"));
      } else {
        const bool was_running = rec->job.state() == v1::Job::RUNNING;
        SetState(*rec, v1::Job::QUEUED,
                 absl::StrCat("queued again: the coordinator restarted",
                              was_running ? absl::StrCat(" while it ran (after step ",
                                                         rec->job.step(), ")")
                                          : "",
                              "; ", CheckpointsNote(rec->checkpoint_dir)));
        queue_.push_back(rec);
      }
    }
    jobs_[id] = rec;
    order_.push_back(rec);
  }
  for (const std::string& p : problems) std::fprintf(stderr, "warning: job record %s\n", p.c_str());
}

}  // namespace adjsh::coordinator
