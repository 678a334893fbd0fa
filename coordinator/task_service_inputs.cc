// The tensors the TaskService streams out to the workers (coordinator/task_service.h): a
// leased task's small inputs (FetchInputs, checked against its lease), and the current step's
// parameters (with a task, or alone: FetchParams), made into tensors once per step and shared
// by every fetch of it (ParamTensors). Streaming happens outside the service's lock; every byte
// sent is counted (bytes_sent, and per task for the step's profile).
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/model.h"
#include "common/strings.h"
#include "coordinator/task_service.h"
#include "engine/families/families.h"
#include "proto/status_util.h"
#include "proto/tensor_codec.h"

namespace adjsh::coordinator {
namespace {

grpc::Status Error(const absl::Status& s) { return ToGrpcStatus(s); }

}  // namespace

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

std::shared_ptr<const TensorMap> TaskServiceImpl::ParamTensors() {
  if (!current_->param_tensors) {
    current_->param_tensors = std::make_shared<const TensorMap>(std::visit(
        [](auto* p) {
          return FamilyOf<std::remove_cvref_t<decltype(*p)>>::ToTensors(*p, DType::kF32);
        },
        current_->params));
    ++param_snapshots_;
  }
  return current_->param_tensors;
}

}  // namespace adjsh::coordinator
