// absl::Status <-> grpc::Status at the RPC boundary. The seventeen canonical codes are the same
// in both (OK = 0 ... UNAUTHENTICATED = 16) and map one-to-one by name; the message is kept.
// A code outside that set (a peer's gRPC sending something new) becomes UNKNOWN, with the number
// noted in the message. Status payloads are not carried.
//
//   grpc::Status PullTask(...) override { return ToGrpcStatus(impl_.PullTask(...)); }
//   absl::Status s = FromGrpcStatus(stub->PullTask(&ctx, request, &response));
#ifndef ADJSH_PROTO_STATUS_UTIL_H_
#define ADJSH_PROTO_STATUS_UTIL_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace adjsh {

grpc::StatusCode ToGrpcCode(absl::StatusCode code);
absl::StatusCode FromGrpcCode(grpc::StatusCode code);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace adjsh

#endif  // ADJSH_PROTO_STATUS_UTIL_H_
