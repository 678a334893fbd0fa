// Who may call what on the coordinator, decided per call from the method, the TLS peer and the
// call's `authorization: Bearer TOKEN` metadata (installed by ServerCredentialsFor):
//
//   /adjsh.v1.JobService/*   needs the job token.
//       no token: UNAUTHENTICATED, or PERMISSION_DENIED for a caller with a verified client
//       certificate (a worker's certificate does not grant the job API); a wrong token or a
//       malformed authorization header: UNAUTHENTICATED.
//   /adjsh.v1.TaskService/*  needs a client certificate verified against the coordinator's CA
//       (mutual TLS). Without one: PERMISSION_DENIED when the call carries the valid job token
//       (a job client is not a worker), UNAUTHENTICATED otherwise.
//   /adjsh.v1.PeerService/*  (a worker's endpoint for its tree peers) needs a client
//       certificate verified against the CA, UNAUTHENTICATED without one.
//   /grpc.health.v1.Health/* any caller that completed the TLS handshake (a load balancer's
//       or client's check of the address it dials: no certificate or token needed).
//   anything else            PERMISSION_DENIED.
//
// A client certificate signed by another CA fails the TLS handshake before any call (the
// client sees UNAVAILABLE with a handshake error). Tokens are compared in constant time.
#ifndef ADJSH_PROTO_AUTH_POLICY_H_
#define ADJSH_PROTO_AUTH_POLICY_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace adjsh {

// Equal bytes; the time taken depends on the lengths only, not on where they differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The decision above. method: the call's path ("/adjsh.v1.JobService/SubmitJob");
// authorization: the header's value, if the call has one.
absl::Status AuthorizeCall(std::string_view method, bool verified_client_cert,
                           std::optional<std::string_view> authorization,
                           std::string_view job_token);

// The gRPC hook that applies AuthorizeCall to every call of a TLS server.
class CoordinatorAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit CoordinatorAuthProcessor(std::string job_token) : job_token_(std::move(job_token)) {}
  bool IsBlocking() const override { return false; }  // no I/O: decide on gRPC's own thread
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const std::string job_token_;
};

}  // namespace adjsh

#endif  // ADJSH_PROTO_AUTH_POLICY_H_
