#include "coordinator/task_service.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model.h"
#include "engine/reduce_groups.h"
#include "common/strings.h"
#include "proto/span_kind.h"
#include "proto/status_util.h"
#include "proto/tensor_codec.h"

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

absl::Status TaskServiceImpl::StreamOut(const TensorMap& tensors,
                                        grpc::ServerWriter<v1::TensorChunk>* writer,
                                        uint64_t* sent) {
  for (const auto& [name, tensor] : tensors) {
    absl::Status s = StreamTensor(name, tensor, kDefaultPieceBytes, [&](const v1::TensorChunk& c) {
      bytes_sent_.fetch_add(c.data().size());
      *sent += c.data().size();
      return writer->Write(c) ? absl::OkStatus()
                              : absl::UnavailableError("the worker closed the stream");
    });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
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

void TaskServiceImpl::CountRefusedResult(const std::string& worker_id, const std::string& task_id,
                                         absl::string_view why) {
  auto w = workers_.find(worker_id);
  if (w == workers_.end()) return;  // reaped meanwhile
  CountSkip(w->second, absl::StrCat("its result of task ", task_id, " was refused: ", why));
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

grpc::Status TaskServiceImpl::FetchInputs(grpc::ServerContext* ctx,
                                          const v1::FetchInputsRequest* req,
                                          grpc::ServerWriter<v1::TensorChunk>* writer) {
  TensorMap inputs;
  std::shared_ptr<const TensorMap> params;
  int64_t task = 0, version = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t lease = 0;
    if (absl::Status s = CheckLease(ctx, req->worker_id(), req->task_id(), req->lease_id(), &task,
                                    &lease);
        !s.ok())
      return Error(s);
    int64_t local = 0;
    inputs = current_->Locate(task, &local).Inputs(local, req->include_span());
    if (req->include_params()) params = ParamTensors();
    version = current_->version;
  }
  // Streamed outside the lock: the task's tensors are this call's own copy, the parameters the
  // step's one snapshot, which no one changes.
  uint64_t sent = 0;
  if (absl::Status s = StreamOut(inputs, writer, &sent); !s.ok()) return Error(s);
  if (params) {
    if (absl::Status s = StreamOut(*params, writer, &sent); !s.ok()) return Error(s);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (current_ && current_->version == version) current_->fetched[task] += sent;
  return grpc::Status::OK;
}

grpc::Status TaskServiceImpl::PushResult(grpc::ServerContext* ctx,
                                         grpc::ServerReader<v1::ResultChunk>* reader,
                                         v1::PushResultResponse* resp) {
  v1::ResultChunk msg;
  if (!reader->Read(&msg) || !msg.has_header()) {
    return Error(absl::InvalidArgumentError("a result stream must start with its header"));
  }
  const v1::ResultHeader header = msg.header();
  AssemblerLimits limits;
  {
    // Fail fast on a stale lease, and never buffer much more than this task's result can be.
    std::lock_guard<std::mutex> lock(mu_);
    int64_t task = 0, lease = 0;
    if (absl::Status s = CheckLease(ctx, header.worker_id(), header.task_id(), header.lease_id(),
                                    &task, &lease);
        !s.ok()) {
      if (!absl::IsFailedPrecondition(s) && !absl::IsNotFound(s)) return Error(s);
      ++rejected_;
      resp->set_accepted(false);
      resp->set_reason(std::string(s.message()));
      return grpc::Status::OK;
    }
    // Twice the right size (and at least 64 KiB): a slightly wrong result still reaches the
    // shape checks and their clearer message; a hostile size is refused at its header.
    int64_t local = 0;
    const SpanScheduler& seq = current_->Locate(task, &local);
    limits.max_total_bytes = std::min<uint64_t>(opt_.max_result_bytes, seq.MaxResultBytes(local));
    limits.max_tensor_bytes = limits.max_total_bytes;
    // The result's tensors, and one more so that an extra one is named in the error.
    limits.max_tensors = LayerParamSlots<float>().size() + 8;
  }
  uint64_t result_bytes = 0;
  absl::StatusOr<TensorMap> read =
      ReadTensorStream<grpc::ServerReader<v1::ResultChunk>, v1::ResultChunk>(
          *reader, limits, "result", &result_bytes);
  if (!read.ok()) {
    // Its lease checked above: a worker whose results never fit (another version, say) counts
    // it as a skip, as a malformed result below; the lease is kept for a good result.
    std::lock_guard<std::mutex> lock(mu_);
    CountRefusedResult(header.worker_id(), header.task_id(), read.status().message());
    return Error(read.status());
  }
  TensorMap tensors = *std::move(read);
  bytes_received_.fetch_add(result_bytes);

  std::lock_guard<std::mutex> lock(mu_);
  int64_t task = 0, lease = 0;
  if (absl::Status s = CheckLease(ctx, header.worker_id(), header.task_id(), header.lease_id(), &task,
                                  &lease);
      !s.ok()) {
    if (!absl::IsFailedPrecondition(s) && !absl::IsNotFound(s)) return Error(s);
    ++rejected_;  // late, duplicate, or for a finished step: not an error of the stream
    resp->set_accepted(false);
    resp->set_reason(std::string(s.message()));
    return grpc::Status::OK;
  }
  int64_t local = 0;
  SpanScheduler& seq = current_->Locate(task, &local);
  SpanScheduler::Result result;
  std::string bad;
  if (absl::Status s = seq.CheckResult(local, tensors, result, &bad); !s.ok()) {
    // Malformed (a worker of another version, say): counted as a skip, so that a worker whose
    // results are never accepted does not get the task back for ever. The lease is kept.
    CountRefusedResult(header.worker_id(), header.task_id(), s.message());
    return Error(s);
  }
  if (!bad.empty()) {
    // Refused before anything is applied: the task goes back to the queue for another try.
    seq.queue().Release(local, lease).IgnoreError();
    work_cv_.notify_all();
    Worker& w = workers_[header.worker_id()];
    w.leases.erase(task);
    ++w.nonfinite_results;
    ++nonfinite_;
    ++rejected_;
    resp->set_accepted(false);
    resp->set_reason(absl::StrCat("refused: the result has a non-finite value (", bad,
                                  "); task ", header.task_id(), " is handed out again"));
    return grpc::Status::OK;
  }
  if (absl::Status s = seq.queue().Complete(local, lease); !s.ok()) {
    ++rejected_;
    resp->set_accepted(false);
    resp->set_reason(std::string(s.message()));
    return grpc::Status::OK;
  }
  Worker& w = workers_[header.worker_id()];
  rebuilds_ += result.rebuild_seconds > 0 ? 1 : 0;
  seq.Apply(local, std::move(result), w.name.empty() ? header.worker_id() : w.name,
            current_->fetched[task], result_bytes, current_->leased_at[task]);
  w.leases.erase(task);
  w.skipped_tasks = 0;
  ++accepted_;
  resp->set_accepted(true);
  if (current_->Done()) done_cv_.notify_all();
  work_cv_.notify_all();  // its successors may be ready
  return grpc::Status::OK;
}

grpc::Status TaskServiceImpl::FetchParams(grpc::ServerContext* ctx,
                                          const v1::FetchParamsRequest* req,
                                          grpc::ServerWriter<v1::TensorChunk>* writer) {
  std::shared_ptr<const TensorMap> params;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckRegistered(ctx, req->worker_id()); !s.ok()) return Error(s);
    if (!current_ || current_->job_id != req->job_id() ||
        static_cast<uint64_t>(current_->version) != req->params_version()) {
      return Error(absl::FailedPreconditionError(
          absl::StrCat("parameters version ", req->params_version(), " of job \"",
                       Echo(req->job_id()), "\" are not the current step's")));
    }
    params = ParamTensors();
  }
  uint64_t sent = 0;  // outside the lock: the step's snapshot, which no one changes
  if (absl::Status s = StreamOut(*params, writer, &sent); !s.ok()) return Error(s);
  return grpc::Status::OK;
}

grpc::Status TaskServiceImpl::PushReduced(grpc::ServerContext* ctx,
                                          grpc::ServerReader<v1::SumChunk>* reader,
                                          v1::PushResultResponse* resp) {
  v1::SumChunk msg;
  if (!reader->Read(&msg) || !msg.has_header()) {
    return Error(absl::InvalidArgumentError("a sum stream must start with its header"));
  }
  const v1::SumHeader header = msg.header();
  auto refuse = [&](std::string why) {
    resp->set_accepted(false);
    resp->set_reason(std::move(why));
    return grpc::Status::OK;
  };
  // The step this root is for, checked before and after its tensors arrive.
  auto check = [&]() -> absl::StatusOr<bool> {
    if (absl::Status s = CheckRegistered(ctx, header.worker_id()); !s.ok()) return s;
    if (!current_ || current_->job_id != header.job_id() ||
        static_cast<uint64_t>(current_->version) != header.params_version() ||
        !current_->seqs[0]->among_workers()) {  // a tree's step has one sequence
      return false;
    }
    const int64_t S = current_->seqs[0]->plan().spans();
    const int64_t K = current_->seqs[0]->plan().layers();
    if (header.group() < 0 || header.group() >= NumGroups(K) || header.lo() != 0 ||
        header.hi() != S) {
      return absl::InvalidArgumentError(
          absl::StrCat("the coordinator takes the roots [0, ", S, ") of groups 0..",
                       NumGroups(K) - 1, " only, not [", header.lo(), ", ", header.hi(),
                       ") of group ", header.group()));
    }
    return true;
  };
  AssemblerLimits limits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StatusOr<bool> ok = check();
    if (!ok.ok()) return Error(ok.status());
    if (!*ok) return refuse("not a root of the current step's worker tree");
    limits.max_total_bytes = 2 * current_->seqs[0]->GroupBytes(header.group()) + (1 << 16);
    limits.max_tensor_bytes = limits.max_total_bytes;
    limits.max_tensors = MaxGroupTensors() + 1;
  }
  uint64_t sum_bytes = 0;
  absl::StatusOr<TensorMap> read = ReadTensorStream<grpc::ServerReader<v1::SumChunk>, v1::SumChunk>(
      *reader, limits, "sum", &sum_bytes);
  if (!read.ok()) return Error(read.status());
  TensorMap tensors = *std::move(read);
  bytes_received_.fetch_add(sum_bytes);
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<bool> ok = check();
  if (!ok.ok()) return Error(ok.status());
  if (!*ok) return refuse("not a root of the current step's worker tree");
  if (absl::Status s = current_->seqs[0]->SetReduced(header.group(), tensors); !s.ok()) {
    if (absl::IsFailedPrecondition(s)) return refuse(std::string(s.message()));
    return Error(s);
  }
  ++roots_;
  resp->set_accepted(true);
  if (current_->Done()) done_cv_.notify_all();
  return grpc::Status::OK;
}

QueueStats TaskServiceImpl::queue_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  QueueStats s;
  if (current_) s = current_->Stats();
  AddLeaseCounters(past_, s);
  return s;
}

TaskServiceImpl::WorkerCounts TaskServiceImpl::worker_counts() const {
  const absl::Time since = absl::Now() - opt_.lease;
  std::lock_guard<std::mutex> lock(mu_);
  WorkerCounts c;
  for (const auto& [id, w] : workers_) {
    c.connected += w.last_seen >= since ? 1 : 0;
    c.live += Live(w, since) ? 1 : 0;
  }
  return c;
}

uint64_t TaskServiceImpl::bytes_sent() const { return bytes_sent_.load(); }
uint64_t TaskServiceImpl::bytes_received() const { return bytes_received_.load(); }

int64_t TaskServiceImpl::results_accepted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accepted_;
}

// A worker unheard of for reap_after holds no lease that could still be valid (leases are far
// shorter), so it is forgotten: workers that never come back cost nothing.
void TaskServiceImpl::ReapWorkers() {
  const absl::Time cutoff = absl::Now() - std::max(opt_.reap_after, 4 * opt_.lease);
  for (auto it = workers_.begin(); it != workers_.end();) {
    it = it->second.last_seen < cutoff ? workers_.erase(it) : std::next(it);
  }
}

int64_t TaskServiceImpl::registered_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(workers_.size());
}

int64_t TaskServiceImpl::results_nonfinite() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nonfinite_;
}

std::shared_ptr<const TensorMap> TaskServiceImpl::ParamTensors() {
  if (!current_->param_tensors) {
    // const_cast: the visit walks a mutable struct, reading only.
    current_->param_tensors = std::make_shared<const TensorMap>(
        current_->mamba2 ? Mamba2ParamsToTensors<float>(
                               const_cast<Mamba2Params<float>&>(*current_->mamba2), DType::kF32)
                         : ParamsToTensors<float>(*current_->params, DType::kF32));
    ++param_snapshots_;
  }
  return current_->param_tensors;
}

int64_t TaskServiceImpl::param_snapshots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return param_snapshots_;
}

std::string TaskServiceImpl::ShunNote() const {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time since = absl::Now() - opt_.lease;
  for (const auto& [id, w] : workers_) {
    if (w.last_seen < since) continue;
    const std::string who = w.name.empty() ? id : w.name;
    if (w.skipped_tasks >= kShunAfterSkipped) {
      return absl::StrCat("worker ", who, " skipped ", w.skipped_tasks,
                          " tasks in a row (the last: ", w.last_skip, ")");
    }
    if (w.nonfinite_results >= kShunAfterNonFinite) {
      return absl::StrCat("worker ", who, " sent ", w.nonfinite_results,
                          " results with non-finite values");
    }
  }
  return "";
}

int64_t TaskServiceImpl::tasks_skipped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return skipped_;
}

int64_t TaskServiceImpl::span_rebuilds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rebuilds_;
}

int64_t TaskServiceImpl::step_restarts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restarts_;
}

int64_t TaskServiceImpl::roots_accepted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return roots_;
}

int64_t TaskServiceImpl::results_rejected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rejected_;
}

}  // namespace adjsh::coordinator
