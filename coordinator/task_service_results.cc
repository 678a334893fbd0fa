// The results the TaskService takes in from the workers (coordinator/task_service.h): a
// task's result (PushResult), checked against its lease when its header comes and again once
// its tensors are in, checked for shape and for non-finite values, and applied exactly once to
// the step's ledger; and a worker tree's group roots (PushReduced). A result that comes late,
// twice or for a finished step is refused (accepted = false, with the reason), and so is one
// with a non-finite value, whose task is handed out again; a malformed one is the call's error
// and counts against its worker as a skip, its lease kept for a good result.
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model.h"
#include "coordinator/task_service.h"
#include "engine/reduce_groups.h"
#include "proto/status_util.h"
#include "proto/tensor_codec.h"

namespace adjsh::coordinator {
namespace {

grpc::Status Error(const absl::Status& s) { return ToGrpcStatus(s); }

}  // namespace

void TaskServiceImpl::CountRefusedResult(const std::string& worker_id, const std::string& task_id,
                                         absl::string_view why) {
  auto w = workers_.find(worker_id);
  if (w == workers_.end()) return;  // reaped meanwhile
  CountSkip(w->second, absl::StrCat("its result of task ", task_id, " was refused: ", why));
}

grpc::Status TaskServiceImpl::PushResult(grpc::ServerContext* ctx,
                                         grpc::ServerReader<v1::ResultChunk>* reader,
                                         v1::PushResultResponse* resp) {
  v1::ResultChunk msg;
  if (!reader->Read(&msg) || !msg.has_header()) {
    return Error(absl::InvalidArgumentError("a result stream must start with its header"));
  }
  const v1::ResultHeader header = msg.header();
  // Every refusal of the result (not an error of the stream: the answer is accepted = false,
  // with why) is counted in rejected_. Under mu_.
  const auto refuse = [&](std::string why) {
    ++rejected_;
    resp->set_accepted(false);
    resp->set_reason(std::move(why));
    return grpc::Status::OK;
  };
  // A lease that no longer holds (late, duplicate, or for a finished step) is refused; any
  // other failed check (an unknown worker, another identity, a malformed id) is an error.
  const auto lease_failed = [&](const absl::Status& s) {
    if (!absl::IsFailedPrecondition(s) && !absl::IsNotFound(s)) return Error(s);
    return refuse(std::string(s.message()));
  };
  // A result that does not read (too large, say) or is malformed (a worker of another version,
  // say): an error, counted as a skip so that a worker whose results are never accepted does
  // not get the task back for ever. The lease is kept for a good result. Under mu_.
  const auto malformed = [&](const absl::Status& s) {
    CountRefusedResult(header.worker_id(), header.task_id(), s.message());
    return Error(s);
  };
  AssemblerLimits limits;
  {
    // Fail fast on a stale lease, and never buffer much more than this task's result can be.
    std::lock_guard<std::mutex> lock(mu_);
    int64_t task = 0, lease = 0;
    if (absl::Status s = CheckLease(ctx, header.worker_id(), header.task_id(), header.lease_id(),
                                    &task, &lease);
        !s.ok())
      return lease_failed(s);
    // Twice the right size (and at least 64 KiB): a slightly wrong result still reaches the
    // shape checks and their clearer message; a hostile size is refused at its header.
    int64_t local = 0;
    const SpanScheduler& seq = current_->Locate(task, &local);
    limits.max_total_bytes = std::min<uint64_t>(opt_.max_result_bytes, seq.MaxResultBytes(local));
    limits.max_tensor_bytes = limits.max_total_bytes;
    // The result's tensors, and one more so that an extra one is named in the error.
    limits.max_tensors = MaxGroupTensors() + 8;
  }
  uint64_t result_bytes = 0;
  absl::StatusOr<TensorMap> read =
      ReadTensorStream<grpc::ServerReader<v1::ResultChunk>, v1::ResultChunk>(
          *reader, limits, "result", &result_bytes);
  if (!read.ok()) {
    std::lock_guard<std::mutex> lock(mu_);  // its lease was checked above
    return malformed(read.status());
  }
  TensorMap tensors = *std::move(read);
  bytes_received_.fetch_add(result_bytes);

  std::lock_guard<std::mutex> lock(mu_);
  int64_t task = 0, lease = 0;
  if (absl::Status s = CheckLease(ctx, header.worker_id(), header.task_id(), header.lease_id(), &task,
                                  &lease);
      !s.ok())
    return lease_failed(s);
  int64_t local = 0;
  SpanScheduler& seq = current_->Locate(task, &local);
  SpanScheduler::Result result;
  std::string bad;
  if (absl::Status s = seq.CheckResult(local, tensors, result, &bad); !s.ok()) return malformed(s);
  if (!bad.empty()) {
    // Refused before anything is applied: the task goes back to the queue for another try.
    seq.queue().Release(local, lease).IgnoreError();
    work_cv_.notify_all();
    Worker& w = workers_[header.worker_id()];
    w.leases.erase(task);
    ++w.nonfinite_results;
    ++nonfinite_;
    return refuse(absl::StrCat("refused: the result has a non-finite value (", bad, "); task ",
                               header.task_id(), " is handed out again"));
  }
  if (absl::Status s = seq.queue().Complete(local, lease); !s.ok()) {
    return refuse(std::string(s.message()));
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
    // Group TiedEmbedGroup(K) is a tied model's head + lookup (an untied one's is refused by
    // SetReduced, which reads the step's layout).
    if (header.group() < 0 || header.group() > TiedEmbedGroup(K) || header.lo() != 0 ||
        header.hi() != S) {
      return absl::InvalidArgumentError(
          absl::StrCat("the coordinator takes the roots [0, ", S, ") of groups 0..",
                       TiedEmbedGroup(K), " only, not [", header.lo(), ", ", header.hi(),
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

}  // namespace adjsh::coordinator
