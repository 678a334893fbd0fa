// The code tables are written out by name, not cast, so that a renumbering on either side
// would be caught by the tests instead of silently mapping codes to the wrong meaning.
#include "proto/status_util.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace adjsh {

grpc::StatusCode ToGrpcCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return grpc::StatusCode::OK;
    case absl::StatusCode::kCancelled: return grpc::StatusCode::CANCELLED;
    case absl::StatusCode::kUnknown: return grpc::StatusCode::UNKNOWN;
    case absl::StatusCode::kInvalidArgument: return grpc::StatusCode::INVALID_ARGUMENT;
    case absl::StatusCode::kDeadlineExceeded: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case absl::StatusCode::kNotFound: return grpc::StatusCode::NOT_FOUND;
    case absl::StatusCode::kAlreadyExists: return grpc::StatusCode::ALREADY_EXISTS;
    case absl::StatusCode::kPermissionDenied: return grpc::StatusCode::PERMISSION_DENIED;
    case absl::StatusCode::kResourceExhausted: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kFailedPrecondition: return grpc::StatusCode::FAILED_PRECONDITION;
    case absl::StatusCode::kAborted: return grpc::StatusCode::ABORTED;
    case absl::StatusCode::kOutOfRange: return grpc::StatusCode::OUT_OF_RANGE;
    case absl::StatusCode::kUnimplemented: return grpc::StatusCode::UNIMPLEMENTED;
    case absl::StatusCode::kInternal: return grpc::StatusCode::INTERNAL;
    case absl::StatusCode::kUnavailable: return grpc::StatusCode::UNAVAILABLE;
    case absl::StatusCode::kDataLoss: return grpc::StatusCode::DATA_LOSS;
    case absl::StatusCode::kUnauthenticated: return grpc::StatusCode::UNAUTHENTICATED;
    default: break;
  }
  return grpc::StatusCode::UNKNOWN;
}

absl::StatusCode FromGrpcCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return absl::StatusCode::kOk;
    case grpc::StatusCode::CANCELLED: return absl::StatusCode::kCancelled;
    case grpc::StatusCode::UNKNOWN: return absl::StatusCode::kUnknown;
    case grpc::StatusCode::INVALID_ARGUMENT: return absl::StatusCode::kInvalidArgument;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return absl::StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::NOT_FOUND: return absl::StatusCode::kNotFound;
    case grpc::StatusCode::ALREADY_EXISTS: return absl::StatusCode::kAlreadyExists;
    case grpc::StatusCode::PERMISSION_DENIED: return absl::StatusCode::kPermissionDenied;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return absl::StatusCode::kResourceExhausted;
    case grpc::StatusCode::FAILED_PRECONDITION: return absl::StatusCode::kFailedPrecondition;
    case grpc::StatusCode::ABORTED: return absl::StatusCode::kAborted;
    case grpc::StatusCode::OUT_OF_RANGE: return absl::StatusCode::kOutOfRange;
    case grpc::StatusCode::UNIMPLEMENTED: return absl::StatusCode::kUnimplemented;
    case grpc::StatusCode::INTERNAL: return absl::StatusCode::kInternal;
    case grpc::StatusCode::UNAVAILABLE: return absl::StatusCode::kUnavailable;
    case grpc::StatusCode::DATA_LOSS: return absl::StatusCode::kDataLoss;
    case grpc::StatusCode::UNAUTHENTICATED: return absl::StatusCode::kUnauthenticated;
    default: break;
  }
  return absl::StatusCode::kUnknown;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const grpc::StatusCode code = ToGrpcCode(status.code());
  std::string message(status.message());
  // absl keeps a non-canonical raw code but reports code() as kUnknown: say which it was.
  if (status.raw_code() != static_cast<int>(status.code())) {
    message = absl::StrCat("(status code ", status.raw_code(), ") ", message);
  }
  return grpc::Status(code, message);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const absl::StatusCode code = FromGrpcCode(status.error_code());
  if (code == absl::StatusCode::kUnknown && status.error_code() != grpc::StatusCode::UNKNOWN) {
    return absl::UnknownError(absl::StrCat("(gRPC status code ",
                                           static_cast<int>(status.error_code()), ") ",
                                           status.error_message()));
  }
  return absl::Status(code, status.error_message());
}

}  // namespace adjsh
