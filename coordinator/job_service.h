// The coordinator's JobService (proto/adjsh.proto): training jobs, each a train::Trainer whose
// gradient source is the coordinator's TaskServiceImpl: the optimizer runs here, and every
// (layer, span) task of a step (forward, LM head and exact backward, engine/span_plan.h) runs on
// whatever `adjsh worker` processes are connected to that TaskService (with none connected, a
// job waits for one).
//
// Jobs run one at a time, in submission order, on a runner thread. Lifecycle:
//   SubmitJob -> QUEUED -> RUNNING -> SUCCEEDED | FAILED (Job.error says why) | CANCELLED
//   CancelJob: a queued job is marked CANCELLED and never starts; the running job is marked
//   CANCELLED at once (its watchers get the terminal event) and the gradient being computed is
//   abandoned (TaskServiceImpl::CancelCurrent); the runner moves on when the trainer has
//   stopped. A checkpoint that was being written when the cancel came may still complete.
//
// SubmitJob validates the whole spec before queueing it, and the runner turns it into the model,
// corpus and train::TrainOptions, as coordinator/job_spec.h describes (status codes of a refused
// spec; defaults of an unset field, those of `adjsh train`, so that a job and `adjsh train` with
// the same settings end with bitwise the same weights).
// Anything found only when the job starts (corpus shorter than context_length, token ids >= V,
// a checkpoint of another model in checkpoint_dir, unreadable files) makes the job FAILED.
//
// Checkpoints: spec.checkpoint_dir; when it is empty and JobServiceOptions::state_dir is set (as
// `adjsh coordinator` always does), state_dir/<job_id> (unlike the proto's "empty = no
// checkpoints", which holds only for a service without a state_dir). Job ids are "job-1",
// "job-2", ...; with a state_dir, numbering continues after the highest job-N folder already
// there, so a restarted coordinator never reuses an id whose default checkpoints exist.
//
// State is kept in memory only: a restarted coordinator has no jobs. A job is resumed only
// through its checkpoints: submit the same spec again with the same checkpoint_dir (for a job
// that used the default, checkpoint_dir = state_dir/<old job_id>) and it continues from the
// latest checkpoint there, ending bitwise as an uninterrupted run.
//
// ListJobs: newest first; page_size (0 = 100, at most 1000) and page_token (the
// next_page_token of the previous page: an opaque offset into the filtered list; jobs submitted
// between pages shift it) and the states filter are honoured.
//
// WatchJob: an initial event summarising the job as it is now (state, step, loss, tokens/s,
// ETA; message: the error for FAILED), then one event per state change and per finished step
// (message: the checkpoint written at that step, if any), until the terminal event, after which
// the stream ends OK. While no worker could take the running job's tasks for two leases (none
// connected, or every connected one shunned for non-finite results or skipped tasks), one
// event says so (message "waiting for workers: ..."), and one more when a worker can again
// ("workers are back: ..."); a watcher that attaches meanwhile gets the first after the
// summary. A watcher that falls more than 4096 events behind gets a summary event in place of the events it
// missed. The stream ends CANCELLED when the client goes away.
#ifndef ADJSH_COORDINATOR_JOB_SERVICE_H_
#define ADJSH_COORDINATOR_JOB_SERVICE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_observer.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_store.h"
#include "coordinator/task_service.h"
#include "coordinator/worker_wait.h"
#include "proto/adjsh.grpc.pb.h"

namespace adjsh::coordinator {

struct JobServiceOptions {
  // Root of the default checkpoint dirs (state_dir/<job_id>); empty: a job without
  // checkpoint_dir writes no checkpoints. Created when needed.
  std::string state_dir;
  // Threads for the coordinator's own work (forward pass, LM head); 0: one per core.
  int threads = 0;
  // Progress lines (job started, finished, failed) on stderr.
  bool log = false;
  // Told of the running job's start, steps and end (e.g. the metrics); must outlive the service.
  JobObserver* observer = nullptr;
  // Per-job size limits, checked at submit (job_spec.h).
  JobLimits limits;
  // Where a job may read data and write checkpoints besides state_dir (job_paths.h).
  std::vector<std::string> data_roots;
  // Bounds on what callers can make the service hold or send: queued jobs (SubmitJob is then
  // RESOURCE_EXHAUSTED), ended jobs kept for status (the oldest are forgotten), and the bytes
  // of one ListJobs reply (kept under the gRPC message limit; the rest on later pages).
  int64_t max_queued_jobs = 1000;
  int64_t max_finished_jobs = 1000;
  size_t max_reply_bytes = size_t{1} << 20;
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // tasks: the TaskService the workers are connected to; owned by the caller, must outlive this.
  explicit JobServiceImpl(TaskServiceImpl& tasks, JobServiceOptions options = {});
  ~JobServiceImpl() override;  // Shutdown()

  // Marks the queued jobs and the running one CANCELLED ("the coordinator is shutting down"),
  // abandons the running gradient and waits for the runner thread to stop. Watch streams end
  // after their terminal event. Idempotent; SubmitJob answers UNAVAILABLE afterwards.
  void Shutdown();

  // The RPCs as absl calls (the gRPC methods below wrap them).
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> Get(const std::string& job_id) const;
  absl::StatusOr<v1::ListJobsResponse> List(const v1::ListJobsRequest& request) const;
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);
  // The command that starts a worker for this coordinator (known once it serves), for the note
  // that a job waits for workers.
  void SetWorkerCommand(const std::string& command);
  // How many jobs are in each state (every state of v1::Job::State but UNSPECIFIED, zeros too).
  std::map<v1::Job::State, int64_t> CountJobs() const;

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::JobSpec*, v1::Job*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::Job*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::JobEvent>*) override;

 private:
  struct JobRecord {
    v1::Job job;
    std::string checkpoint_dir;  // effective: spec's, or state_dir/job_id, or empty
    std::string state_message;   // the note of the last state change (the error when FAILED)
    double eta_seconds = 0;
    std::deque<double> recent_seconds;  // durations of the last steps, for tokens_per_s
    std::deque<v1::JobEvent> events;    // the newest events; the first has number first_event
    int64_t first_event = 0;
    std::atomic<bool> cancel{false};  // the runner stops at its next chance
    // The standing "waiting for workers" note (coordinator/worker_wait.h), for a watcher that
    // attaches while it stands; "" when none.
    std::string worker_note;
    int64_t next_event() const { return first_event + static_cast<int64_t>(events.size()); }
  };

  void RunLoop();
  // Loads the model and data and trains; returns when the job ends (any way).
  absl::Status RunJob(JobRecord& rec);
  // The job's training with its model loaded, for either model type (P: ModelParams<float> or
  // Mamba2Params<float>); defined in job_service.cc.
  template <typename P>
  absl::Status TrainJob(JobRecord& rec, const v1::JobSpec& spec, const std::string& job_id,
                        const std::string& ckpt, P params);
  absl::Status RunJobGuarded(JobRecord& rec);
  void ForgetOldJobs();  // requires mu_
  void Persist(const JobRecord& rec);  // to store_ (a warning when it fails). Requires mu_.
  void LoadStoredJobs();               // at construction. Requires mu_.
  // Re-sends CancelCurrent while the running job is cancelled and has not stopped (a cancel
  // that arrives between two gradients, or while one is being set up, would be lost otherwise).
  void CancelPump();
  // A few times a lease (at most once a second) while a job runs: tells its watchers, and the
  // log, when no worker could take its tasks for two leases, and when one can again
  // (coordinator/worker_wait.h).
  void WatchWorkers();
  // Requires mu_. Publishes worker_wait_'s note for the running job rec, if it has one with
  // these worker counts (read before mu_ was taken).
  void NoteWorkers(JobRecord& rec, const TaskServiceImpl::WorkerCounts& workers);
  // Requires mu_. Records an event and wakes the watchers.
  void PushEvent(JobRecord& rec, v1::JobEvent event);
  // Requires mu_. Sets state (+ error), updated time, and pushes the state-change event.
  void SetState(JobRecord& rec, v1::Job::State state, const std::string& message);
  // Requires mu_. The event summarising the job as it is now.
  v1::JobEvent Summary(const JobRecord& rec) const;
  std::shared_ptr<JobRecord> Find(const std::string& job_id) const;  // requires mu_
  // Small helpers the service's files (coordinator/job_service*.cc) share.
  static absl::Status UnknownJob(const std::string& job_id);  // NOT_FOUND, naming the id
  // The note on where a job writes its checkpoints, for its state messages.
  static std::string CheckpointsNote(const std::string& checkpoint_dir);
  static bool Terminal(v1::Job::State s);  // SUCCEEDED, FAILED or CANCELLED
  static std::string StateName(v1::Job::State s);
  static void SetNow(google::protobuf::Timestamp* ts);  // to the current time

  TaskServiceImpl& tasks_;
  const JobServiceOptions opt_;
  // Random per coordinator process. Tasks carry "<job_id>@<instance_>" as their job id: job ids
  // and parameter versions start again after a restart, and workers that outlive a coordinator
  // cache parameters by (task job id, params_version), so the task job id must not repeat.
  const std::string instance_;
  const JobStore store_;  // the job table on disk (state_dir/jobs); disabled without a state dir
  // Held around every CancelCurrent and while the runner retires a job, so that a cancel meant
  // for one job never reaches the gradient of the next. Taken before mu_.
  std::mutex cancel_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // queue_, events, running_, stopping_, pump_stop_
  std::map<std::string, std::shared_ptr<JobRecord>> jobs_;  // guarded by mu_
  std::vector<std::shared_ptr<JobRecord>> order_;           // submission order; guarded by mu_
  std::deque<std::shared_ptr<JobRecord>> queue_;            // guarded by mu_
  std::shared_ptr<JobRecord> running_;                      // guarded by mu_
  WorkerWaitNote worker_wait_;  // of the running job (reset as each starts); guarded by mu_
  int64_t next_id_ = 1;                                     // guarded by mu_
  bool stopping_ = false;                                   // guarded by mu_
  bool pump_stop_ = false;                                  // guarded by mu_
  std::thread runner_, pump_, worker_watch_;
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_JOB_SERVICE_H_
