// A job's events and those who watch them (coordinator/job_service.h): every state change
// (SetState: recorded on disk, logged, and sent as a summary event), the bounded event log each
// job keeps and the summary that stands in for events a watcher missed, the WatchJob stream,
// and the note that a running job waits for workers (WatchWorkers, a few times a lease) and
// that they are back.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "coordinator/job_service.h"
#include "proto/status_util.h"

namespace adjsh::coordinator {
namespace {

constexpr size_t kMaxEvents = 4096;  // kept per job for watchers that lag behind

}  // namespace

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
