// The TaskService's workers and their leases (coordinator/task_service.h): registration and
// the identity each later call must come with, the unguessable worker ids and lease secrets,
// handing a worker its next task (PullTask's long poll, owned spans first), renewing leases
// (Heartbeat), the tasks a worker skipped, and forgetting workers long unheard of. The tensors
// a task fetches are in coordinator/task_service_inputs.cc, the results and roots it sends
// back in coordinator/task_service_results.cc, the step itself in
// coordinator/task_service_step.cc.
#include "coordinator/task_service.h"

#include <malloc.h>

#include <algorithm>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/strings.h"
#include "proto/span_kind.h"
#include "proto/status_util.h"

namespace adjsh::coordinator {
namespace {

grpc::Status Error(const absl::Status& s) { return ToGrpcStatus(s); }

// The caller's identity under mutual TLS (the client certificate's names, as gRPC gives them),
// or "" on a connection without one.
std::string PeerIdentity(const grpc::ServerContext* ctx) {
  if (ctx == nullptr) return "";
  const std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  std::string id;
  for (const grpc::string_ref& name : auth->GetPeerIdentity()) {
    if (!id.empty()) id += ",";
    id.append(name.data(), name.size());
  }
  return id;
}

}  // namespace

void LimitMallocArenasForServing() { mallopt(M_ARENA_MAX, 2); }

TaskServiceImpl::TaskServiceImpl(TaskServiceOptions options) : opt_(options) {}

// 128 bits from the kernel's generator (std::random_device reads /dev/urandom here): worker ids
// and lease secrets no caller can guess from its own.
std::string TaskServiceImpl::Unguessable() {
  std::random_device entropy;
  uint64_t a = 0, b = 0;
  for (int i = 0; i < 2; ++i) {
    a = (a << 32) | entropy();
    b = (b << 32) | entropy();
  }
  return absl::StrCat(absl::Hex(a, absl::kZeroPad16), absl::Hex(b, absl::kZeroPad16));
}

std::string TaskServiceImpl::TaskName(int64_t version, int64_t task) {
  return absl::StrCat(version, ":", task);
}

absl::Status TaskServiceImpl::ParseTaskName(const std::string& name, int64_t* version,
                                            int64_t* task) const {
  const std::vector<std::string> parts = absl::StrSplit(name, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], version) ||
      !absl::SimpleAtoi(parts[1], task)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed task id \"", Echo(name), "\""));
  }
  const bool current = current_ && current_->version == *version;
  if (!current && *version > 0 && *version <= next_version_) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", Echo(name), " belongs to a finished or cancelled step"));
  }
  if (!current || *task < 0 || *task >= current_->num_tasks()) {
    return absl::NotFoundError(absl::StrCat("task ", Echo(name), " is not part of the current step"));
  }
  return absl::OkStatus();
}

absl::Status TaskServiceImpl::CheckCaller(const Worker& w, const std::string& worker_id,
                                          const grpc::ServerContext* ctx) const {
  if (PeerIdentity(ctx) == w.identity) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "worker \"", worker_id, "\" was registered with another client certificate"));
}

absl::Status TaskServiceImpl::CheckRegistered(const grpc::ServerContext* ctx,
                                              const std::string& worker_id) const {
  const auto w = workers_.find(worker_id);
  if (w == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown worker \"", Echo(worker_id), "\": register"));
  }
  return CheckCaller(w->second, worker_id, ctx);
}

absl::Status TaskServiceImpl::CheckLease(const grpc::ServerContext* ctx,
                                         const std::string& worker_id,
                                         const std::string& task_name,
                                         const std::string& lease_id, int64_t* task,
                                         int64_t* lease) const {
  if (absl::Status s = CheckRegistered(ctx, worker_id); !s.ok()) return s;
  int64_t version = 0;
  if (absl::Status s = ParseTaskName(task_name, &version, task); !s.ok()) return s;
  // A lease id on the wire is "<the queue's lease number>.<a secret drawn for that lease>".
  const size_t dot = lease_id.find('.');
  if (dot == std::string::npos || !absl::SimpleAtoi(lease_id.substr(0, dot), lease)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed lease id \"", Echo(lease_id), "\""));
  }
  const auto secret = current_->lease_secrets.find(*task);
  const bool secret_ok = secret != current_->lease_secrets.end() &&
                         secret->second.first == *lease &&
                         secret->second.second == lease_id.substr(dot + 1);
  int64_t local = 0;
  absl::StatusOr<TaskInfo> info = current_->Locate(*task, &local).queue().GetTask(local);
  if (!info.ok()) return info.status();
  if (!secret_ok || info->state != TaskState::kLeased || info->lease_id != *lease ||
      info->worker_id != worker_id || info->expiry <= absl::Now()) {
    return absl::FailedPreconditionError(
        absl::StrCat("lease ", Echo(lease_id), " of task ", Echo(task_name), " is no longer valid"));
  }
  return absl::OkStatus();
}

bool TaskServiceImpl::Live(const Worker& w, absl::Time since) {
  return w.last_seen >= since && w.nonfinite_results < kShunAfterNonFinite &&
         w.skipped_tasks < kShunAfterSkipped;
}

void TaskServiceImpl::CountSkip(Worker& w, std::string why) {
  ++w.skipped_tasks;
  if (why.size() > 1024) why.resize(1024);
  w.last_skip = std::move(why);
  ++skipped_;
}

void TaskServiceImpl::EndSkipped(const grpc::ServerContext* ctx, const std::string& worker_id,
                                 const v1::SkippedTask& skipped) {
  int64_t task = 0, lease = 0;
  if (!CheckLease(ctx, worker_id, skipped.task_id(), skipped.lease_id(), &task, &lease).ok())
    return;  // lapsed already, or of an earlier step: nothing to end or count
  int64_t local = 0;
  current_->Locate(task, &local).queue().Release(local, lease).IgnoreError();
  Worker& w = workers_[worker_id];
  w.leases.erase(task);
  CountSkip(w, absl::StrCat("task ", skipped.task_id(), ": ", skipped.reason()));
  work_cv_.notify_all();
}

std::vector<std::string> TaskServiceImpl::LiveWorkers() const {
  const absl::Time since = absl::Now() - opt_.lease;
  std::vector<std::string> live;
  for (const auto& [id, w] : workers_)
    if (Live(w, since)) live.push_back(id);
  return live;
}

grpc::Status TaskServiceImpl::RegisterWorker(grpc::ServerContext* ctx,
                                             const v1::RegisterWorkerRequest* req,
                                             v1::RegisterWorkerResponse* resp) {
  if (req->worker_name().size() > kMaxWorkerNameBytes) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("worker_name: ", req->worker_name().size(), " bytes, over the limit of ",
                     kMaxWorkerNameBytes)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ReapWorkers();
  if (workers_.size() >= static_cast<size_t>(opt_.max_workers)) {
    return Error(absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator has ", workers_.size(), " workers registered, its limit")));
  }
  if (req->peer_address().size() > kMaxWorkerNameBytes) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("peer_address: ", req->peer_address().size(), " bytes, over the limit of ",
                     kMaxWorkerNameBytes)));
  }
  const std::string id = absl::StrCat("w", Unguessable());
  workers_[id].name = req->worker_name();
  workers_[id].peer_address = req->peer_address();
  workers_[id].identity = PeerIdentity(ctx);  // every later call must come with the same
  workers_[id].last_seen = absl::Now();
  resp->set_worker_id(id);
  resp->set_heartbeat_interval_ms(opt_.heartbeat_interval_ms);
  return grpc::Status::OK;
}

grpc::Status TaskServiceImpl::PullTask(grpc::ServerContext* ctx, const v1::PullTaskRequest* req,
                                       v1::PullTaskResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  // Its skipped tasks first (a worker pulls one task at a time: one at most, normally).
  for (int i = 0; i < std::min(req->skipped_size(), kMaxSkippedPerPull); ++i)
    EndSkipped(ctx, req->worker_id(), req->skipped(i));
  // A long poll: with nothing ready for this worker, wait (up to long_poll) for a result that
  // makes a task ready, so that a span's next task starts without a polling delay.
  const absl::Time until = absl::Now() + opt_.long_poll;
  for (;;) {
    auto w = workers_.find(req->worker_id());
    if (w == workers_.end()) {
      return Error(
          absl::NotFoundError(absl::StrCat("unknown worker \"", Echo(req->worker_id()), "\"")));
    }
    if (absl::Status s = CheckCaller(w->second, req->worker_id(), ctx); !s.ok()) return Error(s);
    w->second.last_seen = absl::Now();
    if (w->second.nonfinite_results >= kShunAfterNonFinite) {
      return Error(absl::PermissionDeniedError(absl::StrCat(
          "worker \"", req->worker_id(), "\" sent ", w->second.nonfinite_results,
          " results with non-finite values and is given no more tasks")));
    }
    if (w->second.skipped_tasks >= kShunAfterSkipped) {
      // Not an error: the worker waits (it may run the next job's tasks), and says why once.
      resp->mutable_no_task()->set_retry_after_ms(
          std::max<int64_t>(opt_.retry_after_ms, absl::ToInt64Milliseconds(opt_.lease)));
      resp->mutable_no_task()->set_reason(absl::StrCat(
          "this worker skipped ", w->second.skipped_tasks, " tasks of job ", skips_job_,
          " in a row (the last: ", w->second.last_skip, "); it gets no more of them, and the "
          "other workers take its spans"));
      return grpc::Status::OK;
    }
    if (TryLease(req->worker_id(), w->second, resp)) return grpc::Status::OK;
    const absl::Time now = absl::Now();
    if (now >= until || ctx->IsCancelled()) break;
    work_cv_.wait_for(lock, absl::ToChronoMilliseconds(until - now) +
                                std::chrono::milliseconds(1));
  }
  resp->mutable_no_task()->set_retry_after_ms(opt_.retry_after_ms);
  return grpc::Status::OK;
}

bool TaskServiceImpl::TryLease(const std::string& worker_id, Worker& worker,
                               v1::PullTaskResponse* resp) {
  RestartIfTreeLost();
  if (current_) {
    const absl::Time since = absl::Now() - opt_.lease;
    const auto live = [&](const std::string& id) {
      auto it = workers_.find(id);
      return it != workers_.end() && Live(it->second, since);
    };
    int64_t live_count = 0;
    for (const auto& [id, w] : workers_) live_count += Live(w, since) ? 1 : 0;
    // The worker's own spans first, sequence by sequence; else a claim, likewise.
    const std::vector<std::unique_ptr<SpanScheduler>>& seqs = current_->seqs;
    std::optional<LeasedTask> leased;
    size_t b = 0;
    for (; b < seqs.size() && !leased; ++b) leased = seqs[b]->NextOwned(worker_id, opt_.lease);
    if (!leased)
      for (b = 0; b < seqs.size() && !leased; ++b)
        leased = seqs[b]->Claim(worker_id, live, live_count, opt_.lease);
    if (leased) {
      const SpanScheduler& seq = *seqs[--b];
      const GradOptions& options = current_->pieces[b].options;
      const SpanTask& task = seq.task(leased->task_id);
      const SpanPlan& plan = seq.plan();
      const int64_t id = current_->first[b] + leased->task_id;
      v1::Task* t = resp->mutable_task();
      t->set_task_id(TaskName(current_->version, id));
      const std::string secret = Unguessable().substr(0, 16);
      current_->lease_secrets[id] = {leased->lease_id, secret};
      current_->leased_at[id] = absl::Now();
      current_->fetched[id] = 0;
      t->set_lease_id(absl::StrCat(leased->lease_id, ".", secret));
      t->set_lease_expires_ms(absl::ToInt64Milliseconds(opt_.lease));
      t->set_job_id(current_->job_id);
      t->set_step(current_->step);
      t->set_kind(KindOf(task.phase));
      t->set_layer(static_cast<int32_t>(task.layer));
      t->set_span(task.span);
      t->set_spans(plan.spans());
      t->set_chunk(plan.chunk());
      t->set_targets(seq.n_targets());
      t->set_masked(!options.loss_mask.empty());
      t->set_forward_only(options.forward_only);
      t->set_storage(std::string(StorageName(options.storage)));
      t->set_dtype(v1::F32);
      t->set_params_version(static_cast<uint64_t>(current_->version));
      t->set_context_length(plan.T());
      t->set_sequence(static_cast<int64_t>(b));
      t->set_sequences(static_cast<int64_t>(seqs.size()));
      t->set_config_json(current_->config_json);
      if (!current_->tree_workers.empty()) {
        const auto& members = current_->tree_workers;
        *t->mutable_tree() = current_->tree;
        t->mutable_tree()->set_self(static_cast<int32_t>(
            std::find(members.begin(), members.end(), worker_id) - members.begin()));
      }
      worker.leases[id] = leased->lease_id;
      return true;
    }
  }
  return false;
}

grpc::Status TaskServiceImpl::Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                                        v1::HeartbeatResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  auto w = workers_.find(req->worker_id());
  if (w == workers_.end()) {
    return Error(absl::NotFoundError(absl::StrCat("unknown worker \"", Echo(req->worker_id()), "\"")));
  }
  if (absl::Status s = CheckCaller(w->second, req->worker_id(), ctx); !s.ok()) return Error(s);
  w->second.last_seen = absl::Now();
  w->second.resident_bytes = req->resident_bytes();
  w->second.peak_resident_bytes = req->peak_resident_bytes();
  for (const std::string& name : req->task_ids()) {
    int64_t version = 0, task = 0;
    bool renewed = false;
    if (ParseTaskName(name, &version, &task).ok()) {
      auto l = w->second.leases.find(task);
      int64_t local = 0;
      renewed = l != w->second.leases.end() &&
                current_->Locate(task, &local).queue().Renew(local, l->second, req->worker_id())
                    .ok();
    }
    if (!renewed) resp->add_cancelled_task_ids(name);
  }
  return grpc::Status::OK;
}
// A worker unheard of for reap_after holds no lease that could still be valid (leases are far
// shorter), so it is forgotten: workers that never come back cost nothing.
void TaskServiceImpl::ReapWorkers() {
  const absl::Time cutoff = absl::Now() - std::max(opt_.reap_after, 4 * opt_.lease);
  for (auto it = workers_.begin(); it != workers_.end();) {
    it = it->second.last_seen < cutoff ? workers_.erase(it) : std::next(it);
  }
}

}  // namespace adjsh::coordinator
