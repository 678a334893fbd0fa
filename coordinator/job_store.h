// The coordinator's job table on disk, so that jobs outlive the process: one JSON file per job,
// state_dir/jobs/<job_id>.json, holding the Job (spec, state, progress; protobuf's JSON
// mapping), its effective checkpoint dir and the note of its last state change. Each file is
// replaced atomically (common/file_io.h) at every state change, so a crash at any point leaves
// either the old record or the new one. A coordinator started with the same state dir loads
// them all: ended jobs for status and watch, queued and running ones to run (again) from their
// checkpoints (coordinator/job_service.h).
#ifndef ADJSH_COORDINATOR_JOB_STORE_H_
#define ADJSH_COORDINATOR_JOB_STORE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/adjsh.pb.h"

namespace adjsh::coordinator {

struct StoredJob {
  v1::Job job;
  std::string checkpoint_dir;  // the effective one ("" when the job writes none)
  std::string state_message;
};

class JobStore {
 public:
  explicit JobStore(const std::string& state_dir);  // empty: nothing is stored

  bool enabled() const { return !dir_.empty(); }
  absl::Status Save(const StoredJob& job) const;
  void Remove(const std::string& job_id) const;
  // Every readable record, in job-number order; a record that does not parse is named in
  // *problems and skipped (never deleted: an operator may repair it).
  std::vector<StoredJob> Load(std::vector<std::string>* problems) const;

 private:
  std::string dir_;  // state_dir/jobs
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_JOB_STORE_H_
