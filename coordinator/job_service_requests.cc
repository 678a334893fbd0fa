// The JobService's requests (coordinator/job_service.h): a submitted spec, checked whole (its
// size, its paths confined to the allowed roots, then ValidateJobSpec) before it is queued
// under a new job id; looking a job up (GetJob) and listing jobs page by page (ListJobs);
// cancelling a queued or running job (CancelJob); the jobs counted by state; the bound on the
// ended jobs kept; and the gRPC methods, which wrap these absl calls. Watching a job
// (WatchJob) is in coordinator/job_service_watch.cc.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/strings.h"
#include "coordinator/job_paths.h"
#include "coordinator/job_service.h"
#include "coordinator/job_spec.h"
#include "proto/status_util.h"

namespace adjsh::coordinator {
namespace fs = std::filesystem;
namespace {

constexpr int32_t kDefaultPageSize = 100, kMaxPageSize = 1000;

// The gRPC answer of an absl call: its value into *out, or its error.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* out) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *out = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

std::shared_ptr<JobServiceImpl::JobRecord> JobServiceImpl::Find(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
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

}  // namespace adjsh::coordinator
