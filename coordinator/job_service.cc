// The JobService's runner (coordinator/job_service.h): the service's construction and
// shutdown, and the runner thread that takes the queued jobs one at a time, loads each one's
// model and data, and trains it with its gradients computed on the TaskService's workers,
// recording its progress step by step and how it ended (SUCCEEDED, FAILED, CANCELLED, or
// left RUNNING on disk when the coordinator's shutdown stopped it); and the pump that repeats
// a running job's cancel until its trainer has stopped. The callers' requests are in
// coordinator/job_service_requests.cc, the jobs' events and their watchers in
// coordinator/job_service_watch.cc, the job table on disk in coordinator/job_service_store.cc.
#include "coordinator/job_service.h"

#include <new>
#include <stdexcept>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/file_io.h"
#include "common/model.h"
#include "common/strings.h"
#include "common/mamba2_model.h"
#include "coordinator/job_spec.h"
#include "train/trainer.h"

namespace adjsh::coordinator {
namespace fs = std::filesystem;
namespace {

constexpr size_t kThroughputSteps = 8;  // tokens_per_s: mean over this many recent steps
constexpr char kShuttingDown[] = "cancelled: the coordinator is shutting down";

// The newest checkpoint folder under root (root/latest), or "" when there is none.
std::string LatestCheckpoint(const std::string& root) {
  if (root.empty()) return "";
  absl::StatusOr<std::string> latest = ReadFileToString((fs::path(root) / "latest").string());
  if (!latest.ok()) return "";
  std::string name = *latest;
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name.empty() ? "" : (fs::path(root) / name).string();
}

// 16 random hex digits, different for every coordinator process.
std::string InstanceId() {
  std::random_device rd;
  const uint64_t hi = rd(), lo = rd();
  const uint64_t t = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  return absl::StrFormat("%016x", ((hi << 32) | lo) ^ t);
}

}  // namespace

// The helpers the service's files share (their comments in coordinator/job_service.h).
absl::Status JobServiceImpl::UnknownJob(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("unknown job '", Echo(job_id), "'"));
}

std::string JobServiceImpl::CheckpointsNote(const std::string& checkpoint_dir) {
  return absl::StrCat("checkpoints: ", checkpoint_dir.empty() ? "none" : checkpoint_dir);
}

bool JobServiceImpl::Terminal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED || s == v1::Job::CANCELLED;
}

std::string JobServiceImpl::StateName(v1::Job::State s) { return v1::Job::State_Name(s); }

void JobServiceImpl::SetNow(google::protobuf::Timestamp* ts) {
  const int64_t ns = absl::ToUnixNanos(absl::Now());
  ts->set_seconds(ns / 1000000000);
  ts->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

JobServiceImpl::JobServiceImpl(TaskServiceImpl& tasks, JobServiceOptions options)
    : tasks_(tasks), opt_(std::move(options)), instance_(InstanceId()), store_(opt_.state_dir),
      worker_wait_(2 * tasks.lease()) {
  if (!opt_.state_dir.empty()) {
    // Continue the numbering after the job folders a previous coordinator left.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(opt_.state_dir, ec)) {
      const std::string n = e.path().filename().string();
      int64_t k = 0;
      if (n.rfind("job-", 0) == 0 && absl::SimpleAtoi(n.substr(4), &k) && k >= next_id_) {
        next_id_ = k + 1;
      }
    }
  }
  {
    // And after every job recorded there (those with their own checkpoint dir leave no folder
    // here; the newest record is never forgotten): an old id never names a new job.
    std::lock_guard<std::mutex> lock(mu_);
    LoadStoredJobs();
  }
  runner_ = std::thread([this] { RunLoop(); });
  pump_ = std::thread([this] { CancelPump(); });
  worker_watch_ = std::thread([this] { WatchWorkers(); });
}

JobServiceImpl::~JobServiceImpl() { Shutdown(); }

void JobServiceImpl::Shutdown() {
  {
    std::lock_guard<std::mutex> cancel_lock(cancel_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        stopping_ = true;
        // With a state dir, queued jobs stay queued on disk and the running one is stopped
        // after its last completed step, checkpointed, and recorded as running: a coordinator
        // started again with the state dir runs them all. Without one they cannot come back.
        for (auto& rec : queue_) {
          if (rec->job.state() == v1::Job::QUEUED && !store_.enabled()) {
            SetState(*rec, v1::Job::CANCELLED, kShuttingDown);
          }
        }
        queue_.clear();
        if (running_ && running_->job.state() == v1::Job::RUNNING) {
          running_->cancel.store(true);
          if (!store_.enabled()) SetState(*running_, v1::Job::CANCELLED, kShuttingDown);
        }
      }
      cv_.notify_all();
    }
    tasks_.CancelCurrent();
  }
  if (runner_.joinable()) runner_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    pump_stop_ = true;
    cv_.notify_all();
  }
  if (pump_.joinable()) pump_.join();
  if (worker_watch_.joinable()) worker_watch_.join();
}

void JobServiceImpl::RunLoop() {
  for (;;) {
    std::shared_ptr<JobRecord> rec;
    std::string job_id;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      rec = queue_.front();
      queue_.pop_front();
      if (rec->job.state() != v1::Job::QUEUED) continue;  // cancelled while queued
      running_ = rec;
      worker_wait_.Reset(absl::Now());
      job_id = rec->job.job_id();
      SetState(*rec, v1::Job::RUNNING,
               absl::StrCat("running; ", CheckpointsNote(rec->checkpoint_dir)));
    }
    const absl::Status status = RunJobGuarded(*rec);
    if (opt_.observer != nullptr) opt_.observer->JobEnded(job_id);
    std::lock_guard<std::mutex> cancel_lock(cancel_mu_);
    std::lock_guard<std::mutex> lock(mu_);
    running_.reset();
    if (rec->job.state() == v1::Job::RUNNING && !status.ok() && stopping_ &&
        rec->cancel.load()) {
      // Stopped by the shutdown, not by a user: it stays RUNNING on disk, to run again. (A job
      // whose last step and save were done when the shutdown came succeeded: TrainJob returns
      // OK only then.)
      SetState(*rec, v1::Job::RUNNING,
               absl::StrCat("interrupted by the coordinator's shutdown after step ",
                            rec->job.step(), "; it resumes when the coordinator starts again with "
                            "this state dir (", status.message(), ")"));
    } else if (rec->job.state() == v1::Job::RUNNING) {
      if (status.ok()) {
        SetState(*rec, v1::Job::SUCCEEDED,
                 absl::StrFormat("done: step %d, loss %.4f%s", rec->job.step(), rec->job.loss(),
                                 rec->job.last_checkpoint().empty()
                                     ? ""
                                     : absl::StrCat("; checkpoint ", rec->job.last_checkpoint())));
      } else if (rec->cancel.load()) {
        SetState(*rec, v1::Job::CANCELLED, "cancelled");
      } else {
        SetState(*rec, v1::Job::FAILED, status.ToString());
      }
    }
    cv_.notify_all();
  }
}

// A job that runs out of memory (a model or data set the limits let through, but the machine
// cannot hold) fails alone: the process and every queued job go on.
absl::Status JobServiceImpl::RunJobGuarded(JobRecord& rec) {
  try {
    return RunJob(rec);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("the coordinator ran out of memory for this job");
  } catch (const std::length_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the coordinator ran out of memory for this job (", e.what(), ")"));
  }
}

absl::Status JobServiceImpl::RunJob(JobRecord& rec) {
  v1::JobSpec spec;
  std::string job_id, ckpt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spec = rec.job.spec();
    job_id = rec.job.job_id();
    ckpt = rec.checkpoint_dir;
  }
  return VisitFamily(JobModelType(spec), [&](auto family) -> absl::Status {
    auto params = JobParams<decltype(family)>(spec);
    if (!params.ok()) return params.status();
    return TrainJob(rec, spec, job_id, ckpt, *std::move(params));
  });
}

template <typename P>
absl::Status JobServiceImpl::TrainJob(JobRecord& rec, const v1::JobSpec& spec,
                                      const std::string& job_id, const std::string& ckpt,
                                      P params) {
  const absl::Status cancelled = absl::CancelledError("the job was cancelled");
  if (rec.cancel.load()) return cancelled;
  absl::StatusOr<JobDataSet> data = JobData(spec, opt_.limits, params.config.vocab_size);
  if (!data.ok()) return data.status();
  if (rec.cancel.load()) return cancelled;

  train::TrainOptions opt = JobTrainOptions(spec, opt_.threads, ckpt);
  if (opt.reset_at_documents) {
    opt.doc_starts = std::move(data->doc_starts);
    opt.val_doc_starts = std::move(data->val_doc_starts);
  }
  train::BasicTrainer<P> trainer(std::move(params), std::move(data->corpus), opt);
  // The held-out loss is measured in this process (the evaluation is not distributed yet).
  if (data->val) trainer.set_validation(*std::move(data->val));
  if (absl::Status s = trainer.Init(); !s.ok()) return s;
  if (trainer.resumed()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (rec.job.state() == v1::Job::RUNNING) {
      rec.job.set_step(trainer.state().step);
      rec.job.set_loss(trainer.state().last_loss);
      rec.job.set_last_checkpoint(LatestCheckpoint(ckpt));
      SetNow(rec.job.mutable_updated());
      rec.state_message = absl::StrCat("running; resumed from the checkpoint at step ",
                                       trainer.state().step, " in ", ckpt);
      if (opt_.log) std::fprintf(stderr, "%s: %s\n", job_id.c_str(), rec.state_message.c_str());
      PushEvent(rec, Summary(rec));
    }
  }

  if (opt_.observer != nullptr) {
    opt_.observer->JobStarted(job_id, trainer.state().step, opt.steps,
                              spec.expected_workers());
  }
  const std::string task_job_id = absl::StrCat(job_id, "@", instance_);
  int64_t step = trainer.state().step;
  // The gradients, and the held-out loss (forward-only steps), on the workers.
  const train::GradientSourceFor<P> on_workers = [&](const P& p,
                                                     std::span<const GradPiece> pieces) {
    using Results = decltype(tasks_.ComputeGradients(p, pieces, task_job_id, step));
    if (rec.cancel.load()) return Results(cancelled);
    Results g = tasks_.ComputeGradients(p, pieces, task_job_id, step++);
    if (rec.cancel.load()) return Results(cancelled);
    return g;
  };
  trainer.set_gradient_source(on_workers);
  trainer.set_evaluation_source(on_workers);

  absl::Status trained = trainer.Run([&](const train::StepReport& r) {
    const bool wrote =
        !ckpt.empty() &&
        (r.step == r.steps || (opt.checkpoint_every > 0 && r.step % opt.checkpoint_every == 0));
    const std::string written = wrote ? LatestCheckpoint(ckpt) : "";
    if (opt_.observer != nullptr) opt_.observer->StepDone(job_id, r, opt.context);
    const TaskServiceImpl::WorkerCounts workers = tasks_.worker_counts();  // not under mu_
    std::lock_guard<std::mutex> lock(mu_);
    if (rec.job.state() != v1::Job::RUNNING) return;  // cancelled: no more progress
    // A step is done, so a worker took its tasks: if the wait note stands (the step fell
    // between two of WatchWorkers's ticks), the workers are back, said before the step.
    if (worker_wait_.noted()) NoteWorkers(rec, workers);
    rec.recent_seconds.push_back(r.seconds);
    while (rec.recent_seconds.size() > kThroughputSteps) rec.recent_seconds.pop_front();
    const double secs = std::accumulate(rec.recent_seconds.begin(), rec.recent_seconds.end(), 0.0);
    const double tps = secs > 0 ? static_cast<double>(opt.context) *
                                      static_cast<double>(rec.recent_seconds.size()) / secs
                                : r.tokens_per_s;
    rec.job.set_step(r.step);
    rec.job.set_loss(r.loss);
    rec.job.set_tokens_per_s(tps);
    if (!written.empty()) rec.job.set_last_checkpoint(written);
    SetNow(rec.job.mutable_updated());
    rec.eta_seconds = r.eta_seconds;
    v1::JobEvent e;
    e.set_step(r.step);
    e.set_loss(r.loss);
    e.set_tokens_per_s(tps);
    e.set_eta_seconds(r.eta_seconds);
    e.set_state(v1::Job::RUNNING);
    v1::StepProfile* p = e.mutable_profile();
    p->set_tasks(r.profile.tasks);
    p->set_spans(r.profile.spans);
    p->set_task_seconds(r.profile.task_seconds);
    p->set_critical_path_seconds(r.profile.critical_path_seconds);
    p->set_parallelism(r.profile.parallelism);
    p->set_wire_bytes(r.profile.wire_bytes);
    p->set_rebuilt_spans(r.profile.rebuilt_spans);
    p->set_tree_workers(r.profile.tree_workers);
    p->set_restarts(r.profile.restarts);
    p->set_step_seconds(r.seconds);
    if (!written.empty()) e.set_message(absl::StrCat("checkpoint ", written));
    PushEvent(rec, std::move(e));
    if (!written.empty()) Persist(rec);  // the record's progress follows its checkpoints
  });
  if (trained.ok() || !rec.cancel.load()) return trained;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_ || rec.job.state() != v1::Job::RUNNING) return trained;  // a user's cancel
  }
  // The shutdown's safe point: the trainer holds the state after its last completed step (an
  // abandoned step changed nothing), which is what an undisturbed run had there.
  const absl::Status saved = trainer.SaveCheckpointNow();
  std::lock_guard<std::mutex> lock(mu_);
  rec.job.set_step(trainer.state().step);
  if (!saved.ok()) return saved;
  if (!ckpt.empty()) rec.job.set_last_checkpoint(LatestCheckpoint(ckpt));
  // Every step was done and saved, and the shutdown stopped only the last evaluation: the job
  // is done (run again, it would find nothing to train, or with resume never fail).
  if (trainer.state().step >= opt.steps) {
    rec.job.set_loss(trainer.state().last_loss);  // the last step's on_step did not run
    return absl::OkStatus();
  }
  return absl::CancelledError(
      ckpt.empty() ? "no checkpoint dir: it starts over"
                   : absl::StrCat("checkpointed at step ", trainer.state().step));
}


void JobServiceImpl::CancelPump() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return pump_stop_ || (running_ && running_->cancel.load()); });
    if (pump_stop_) return;
    lock.unlock();
    {
      // Still the same cancelled job: the runner retires jobs under cancel_mu_, held here.
      std::lock_guard<std::mutex> cancel_lock(cancel_mu_);
      bool cancel = false;
      {
        std::lock_guard<std::mutex> inner(mu_);
        cancel = running_ && running_->cancel.load();
      }
      // Not under mu_: the TaskService's lock is held while parameters stream out, and
      // WatchJob, status and the step's progress wait on mu_.
      if (cancel) tasks_.CancelCurrent();
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return pump_stop_; });
  }
}
}  // namespace adjsh::coordinator
