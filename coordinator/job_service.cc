#include "coordinator/job_service.h"

#include <new>
#include <stdexcept>

#include <algorithm>
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
#include "engine/mamba2_model.h"
#include "coordinator/job_paths.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_store.h"
#include "coordinator/worker_wait.h"
#include "proto/status_util.h"
#include "train/trainer.h"

namespace adjsh::coordinator {
namespace fs = std::filesystem;
namespace {

constexpr size_t kMaxEvents = 4096;     // kept per job for watchers that lag behind
constexpr size_t kThroughputSteps = 8;  // tokens_per_s: mean over this many recent steps
constexpr int32_t kDefaultPageSize = 100, kMaxPageSize = 1000;
constexpr char kShuttingDown[] = "cancelled: the coordinator is shutting down";

absl::Status UnknownJob(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("unknown job '", Echo(job_id), "'"));
}

// The note on where a job writes its checkpoints, for its state messages.
std::string CheckpointsNote(const std::string& checkpoint_dir) {
  return absl::StrCat("checkpoints: ", checkpoint_dir.empty() ? "none" : checkpoint_dir);
}

// The gRPC answer of an absl call: its value into *out, or its error.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* out) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *out = std::move(*result);
  return grpc::Status::OK;
}

bool Terminal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED || s == v1::Job::CANCELLED;
}

std::string StateName(v1::Job::State s) { return v1::Job::State_Name(s); }

void SetNow(google::protobuf::Timestamp* ts) {
  const int64_t ns = absl::ToUnixNanos(absl::Now());
  ts->set_seconds(ns / 1000000000);
  ts->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

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

std::shared_ptr<JobServiceImpl::JobRecord> JobServiceImpl::Find(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

void JobServiceImpl::PushEvent(JobRecord& rec, v1::JobEvent event) {
  event.set_job_id(rec.job.job_id());
  if (!event.has_time()) SetNow(event.mutable_time());
  rec.events.push_back(std::move(event));
  while (rec.events.size() > kMaxEvents) {
    rec.events.pop_front();
    ++rec.first_event;
  }
  cv_.notify_all();
}

void JobServiceImpl::SetState(JobRecord& rec, v1::Job::State state, const std::string& message) {
  rec.job.set_state(state);
  if (state == v1::Job::FAILED) rec.job.set_error(message);
  if (Terminal(state)) rec.eta_seconds = 0;
  rec.state_message = message;
  SetNow(rec.job.mutable_updated());
  Persist(rec);
  if (opt_.log) {
    std::fprintf(stderr, "%s: %s%s%s\n", rec.job.job_id().c_str(), StateName(state).c_str(),
                 message.empty() ? "" : ": ", message.c_str());
  }
  PushEvent(rec, Summary(rec));
}

v1::JobEvent JobServiceImpl::Summary(const JobRecord& rec) const {
  v1::JobEvent e;
  e.set_job_id(rec.job.job_id());
  e.set_step(rec.job.step());
  e.set_loss(rec.job.loss());
  e.set_tokens_per_s(rec.job.tokens_per_s());
  e.set_eta_seconds(Terminal(rec.job.state()) ? 0 : rec.eta_seconds);
  e.set_state(rec.job.state());
  e.set_message(rec.state_message);
  SetNow(e.mutable_time());
  return e;
}

absl::StatusOr<v1::Job> JobServiceImpl::Submit(const v1::JobSpec& submitted) {
  // Paths first, so that no answer tells whether a file outside the roots exists.
  if (absl::Status s = CheckSpecRequestSize(submitted); !s.ok()) return s;
  v1::JobSpec spec = submitted;
  if (absl::Status s = ConfineJobPaths(spec, {opt_.data_roots, opt_.state_dir}); !s.ok())
    return s;
  if (absl::Status s = ValidateJobSpec(spec, opt_.limits); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
  if (queue_.size() >= static_cast<size_t>(opt_.max_queued_jobs)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        queue_.size(), " jobs are queued, the coordinator's limit: submit when some have run"));
  }
  ForgetOldJobs();
  auto rec = std::make_shared<JobRecord>();
  const std::string id = absl::StrCat("job-", next_id_++);
  rec->job.set_job_id(id);
  *rec->job.mutable_spec() = spec;
  rec->job.set_state(v1::Job::QUEUED);
  SetNow(rec->job.mutable_created());
  *rec->job.mutable_updated() = rec->job.created();
  rec->checkpoint_dir = !spec.checkpoint_dir().empty() ? spec.checkpoint_dir()
                        : opt_.state_dir.empty()       ? ""
                                                       : (fs::path(opt_.state_dir) / id).string();
  int64_t ahead = running_ ? 1 : 0;
  for (const auto& q : queue_) ahead += q->job.state() == v1::Job::QUEUED ? 1 : 0;
  SetState(*rec, v1::Job::QUEUED,
           absl::StrCat("queued, ", ahead, ahead == 1 ? " job" : " jobs", " ahead; ",
                        CheckpointsNote(rec->checkpoint_dir)));
  jobs_[id] = rec;
  order_.push_back(rec);
  queue_.push_back(rec);
  cv_.notify_all();
  return rec->job;
}

// Keeps at most max_finished_jobs ended jobs (the oldest go first), so a long-lived coordinator's
// job table stays bounded. Requires mu_.
void JobServiceImpl::ForgetOldJobs() {
  int64_t ended = 0;
  for (const auto& rec : order_) ended += Terminal(rec->job.state()) ? 1 : 0;
  for (auto it = order_.begin(); it != order_.end() && ended >= opt_.max_finished_jobs;) {
    if (!Terminal((*it)->job.state())) {
      ++it;
      continue;
    }
    store_.Remove((*it)->job.job_id());
    jobs_.erase((*it)->job.job_id());
    it = order_.erase(it);
    --ended;
  }
}

absl::StatusOr<v1::Job> JobServiceImpl::Get(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<JobRecord> rec = Find(job_id);
  if (!rec) return UnknownJob(job_id);
  return rec->job;
}

absl::StatusOr<v1::ListJobsResponse> JobServiceImpl::List(const v1::ListJobsRequest& req) const {
  if (req.page_size() < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
  const int32_t size =
      req.page_size() == 0 ? kDefaultPageSize : std::min(req.page_size(), kMaxPageSize);
  int64_t offset = 0;
  if (!req.page_token().empty() && (!absl::SimpleAtoi(req.page_token(), &offset) || offset < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: malformed page token '", Echo(req.page_token()), "'"));
  }
  const TaskServiceImpl::WorkerCounts workers = tasks_.worker_counts();  // not under mu_
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const v1::Job*> matching;
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    const v1::Job& job = (*it)->job;
    bool ok = req.states().empty();
    for (int s : req.states()) ok = ok || s == job.state();
    if (ok) matching.push_back(&job);
  }
  // A page ends at page_size jobs or when the next job would take the reply past
  // max_reply_bytes (a page holds at least one job: a job is bounded by the spec's limits).
  v1::ListJobsResponse resp;
  const int64_t n = static_cast<int64_t>(matching.size());
  int64_t k = std::min(offset, n);
  for (; k < n && k - std::min(offset, n) < size; ++k) {
    const size_t bytes = resp.ByteSizeLong() + matching[k]->ByteSizeLong() + 16;
    if (resp.jobs_size() > 0 && bytes > opt_.max_reply_bytes) break;
    *resp.add_jobs() = *matching[k];
  }
  if (k < n) resp.set_next_page_token(absl::StrCat(k));
  resp.set_workers_connected(workers.connected);
  resp.set_workers_taking_tasks(workers.live);
  return resp;
}

absl::StatusOr<v1::Job> JobServiceImpl::Cancel(const std::string& job_id) {
  std::lock_guard<std::mutex> cancel_lock(cancel_mu_);
  v1::Job out;
  bool was_running = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<JobRecord> rec = Find(job_id);
    if (!rec) return UnknownJob(job_id);
    switch (rec->job.state()) {
      case v1::Job::CANCELLED:
        return rec->job;
      case v1::Job::SUCCEEDED:
      case v1::Job::FAILED:
        return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has already finished (",
                                                          StateName(rec->job.state()), ")"));
      case v1::Job::QUEUED:
        SetState(*rec, v1::Job::CANCELLED, "cancelled before it started");
        break;
      default:  // RUNNING
        rec->cancel.store(true);
        was_running = true;
        SetState(*rec, v1::Job::CANCELLED,
                 absl::StrCat("cancelled while running, after step ", rec->job.step(), " of ",
                              rec->job.spec().steps()));
        break;
    }
    out = rec->job;
  }
  if (was_running) tasks_.CancelCurrent();
  return out;
}

std::map<v1::Job::State, int64_t> JobServiceImpl::CountJobs() const {
  std::map<v1::Job::State, int64_t> counts;
  for (v1::Job::State s : {v1::Job::QUEUED, v1::Job::RUNNING, v1::Job::SUCCEEDED,
                           v1::Job::FAILED, v1::Job::CANCELLED})
    counts[s] = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& rec : order_) ++counts[rec->job.state()];
  return counts;
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

void JobServiceImpl::WatchWorkers() {
  const auto tick = std::clamp(absl::ToChronoMilliseconds(tasks_.lease() / 4),
                               std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, tick, [&] { return pump_stop_; });
    if (pump_stop_) return;
    if (!running_ || running_->job.state() != v1::Job::RUNNING) continue;
    const std::shared_ptr<JobRecord> rec = running_;
    // The TaskService's lock is not taken under mu_: it is held while parameters stream out,
    // and WatchJob, status and the step's progress wait on mu_.
    lock.unlock();
    const TaskServiceImpl::WorkerCounts workers = tasks_.worker_counts();
    lock.lock();
    if (running_ == rec && rec->job.state() == v1::Job::RUNNING) NoteWorkers(*rec, workers);
  }
}

void JobServiceImpl::SetWorkerCommand(const std::string& command) {
  std::lock_guard<std::mutex> lock(mu_);
  worker_wait_.set_worker_command(command);
}

void JobServiceImpl::NoteWorkers(JobRecord& rec, const TaskServiceImpl::WorkerCounts& workers) {
  const std::string message = worker_wait_.Update(absl::Now(), workers.connected, workers.live);
  if (message.empty()) return;
  rec.worker_note = worker_wait_.noted() ? message : "";
  if (opt_.log) std::fprintf(stderr, "%s: %s\n", rec.job.job_id().c_str(), message.c_str());
  v1::JobEvent e = Summary(rec);
  e.set_message(message);
  PushEvent(rec, std::move(e));
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
  if (JobIsMamba2(spec)) {
    absl::StatusOr<Mamba2Params<float>> params = LoadMamba2ModelDir<float>(spec.model_dir());
    if (!params.ok()) return params.status();
    return TrainJob(rec, spec, job_id, ckpt, *std::move(params));
  }
  absl::StatusOr<ModelParams<float>> params = JobModelParams(spec);
  if (!params.ok()) return params.status();
  return TrainJob(rec, spec, job_id, ckpt, *std::move(params));
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

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext*, const v1::JobSpec* spec,
                                       v1::Job* job) {
  return Reply(Submit(*spec), job);
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                                    v1::Job* job) {
  return Reply(Get(req->job_id()), job);
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                                      v1::ListJobsResponse* resp) {
  return Reply(List(*req), resp);
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req,
                                       v1::Job* job) {
  return Reply(Cancel(req->job_id()), job);
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  std::shared_ptr<JobRecord> rec;
  v1::JobEvent first, note;
  int64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rec = Find(req->job_id());
    if (!rec) return ToGrpcStatus(UnknownJob(req->job_id()));
    first = Summary(*rec);
    if (!rec->worker_note.empty()) {  // the job is waiting for workers: say so after the summary
      note = first;
      note.set_message(rec->worker_note);
    }
    seq = rec->next_event();
  }
  const grpc::Status gone(grpc::StatusCode::CANCELLED, "the watcher went away");
  if (!writer->Write(first)) return gone;
  if (Terminal(first.state())) return grpc::Status::OK;
  if (!note.message().empty() && !writer->Write(note)) return gone;
  for (;;) {
    std::vector<v1::JobEvent> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return rec->next_event() > seq; });
      if (ctx->IsCancelled()) return gone;
      if (seq < rec->first_event) {  // fell behind the kept events: summarise
        batch.push_back(Summary(*rec));
      } else {
        for (int64_t k = seq; k < rec->next_event(); ++k)
          batch.push_back(rec->events[k - rec->first_event]);
      }
      seq = rec->next_event();
    }
    for (const v1::JobEvent& e : batch) {
      if (!writer->Write(e)) return gone;
      if (Terminal(e.state())) return grpc::Status::OK;
    }
  }
}

}  // namespace adjsh::coordinator
