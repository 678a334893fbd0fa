// When the running job's watchers (and the coordinator's log) are told that no worker can take
// its tasks, and when that one can again. A job's steps run only on `adjsh worker` processes;
// with none connected, or every connected one shunned for non-finite results or skipped tasks
// (TaskServiceImpl::kShunAfterNonFinite, kShunAfterSkipped), it waits, and before this note it
// waited without a word: `watch` showed the last step and nothing else.
//
// The job service (coordinator/job_service.h) asks Update a few times a lease while a job runs,
// with the worker counts of the TaskService. Free of threads and of gRPC, with the time passed
// in, so that tests drive it with a fake clock.
#ifndef ADJSH_COORDINATOR_WORKER_WAIT_H_
#define ADJSH_COORDINATOR_WORKER_WAIT_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/time/time.h"

namespace adjsh::coordinator {

class WorkerWaitNote {
 public:
  // after: how long no live worker may be seen before the note (the job service: two leases,
  // so that a worker between heartbeats, or restarting, is not reported).
  explicit WorkerWaitNote(absl::Duration after) : after_(after) {}

  // A new job begins (or none runs): the wait is measured from `now`, nothing is noted yet.
  void Reset(absl::Time now);

  // connected: workers heard from within a lease; live: those of them that get tasks. Returns
  // the note to publish now, or "": "waiting for workers: ..." once when no worker has been
  // live for `after`, and "workers are back: ..." once when one is live again after that note.
  std::string Update(absl::Time now, int64_t connected, int64_t live);

  bool noted() const { return noted_; }

  // The command that starts a worker for this coordinator, for the note ("": the note says
  // only that the steps run on workers).
  void set_worker_command(std::string command) { command_ = std::move(command); }

 private:
  const absl::Duration after_;
  std::string command_;
  absl::Time none_since_ = absl::InfinitePast();  // InfinitePast: a worker is live
  bool noted_ = false;
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_WORKER_WAIT_H_
