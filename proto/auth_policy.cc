#include "proto/auth_policy.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/strings.h"
#include "proto/status_util.h"

namespace adjsh {
namespace {

constexpr std::string_view kJobService = "/adjsh.v1.JobService/";
constexpr std::string_view kTaskService = "/adjsh.v1.TaskService/";
constexpr std::string_view kPeerService = "/adjsh.v1.PeerService/";
constexpr std::string_view kHealth = "/grpc.health.v1.Health/";
constexpr std::string_view kBearer = "Bearer ";

enum class TokenCheck { kMissing, kValid, kInvalid };

TokenCheck CheckBearer(std::optional<std::string_view> authorization, std::string_view token) {
  if (!authorization.has_value()) return TokenCheck::kMissing;
  if (!absl::StartsWith(ToAbsl(*authorization), ToAbsl(kBearer))) return TokenCheck::kInvalid;
  return ConstantTimeEquals(authorization->substr(kBearer.size()), token) ? TokenCheck::kValid
                                                                          : TokenCheck::kInvalid;
}

}  // namespace

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is read once whatever the contents; a length difference
  // is folded into the same accumulator.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

absl::Status AuthorizeCall(std::string_view method, bool verified_client_cert,
                           std::optional<std::string_view> authorization,
                           std::string_view job_token) {
  // Whether the process serves: what a load balancer or client asks of the address it dials,
  // over the same TLS, with no certificate or token of its own.
  if (absl::StartsWith(ToAbsl(method), ToAbsl(kHealth))) return absl::OkStatus();
  const TokenCheck token = CheckBearer(authorization, job_token);
  if (absl::StartsWith(ToAbsl(method), ToAbsl(kJobService))) {
    switch (token) {
      case TokenCheck::kValid:
        return absl::OkStatus();
      case TokenCheck::kInvalid:
        return absl::UnauthenticatedError(
            "the job API refused the bearer token: it is not the coordinator's token (check "
            "--auth-token-file or ADJSH_AUTH_TOKEN)");
      case TokenCheck::kMissing:
        if (verified_client_cert) {
          return absl::PermissionDeniedError(
              "a worker's client certificate does not grant the job API; present the job "
              "token (--auth-token-file or ADJSH_AUTH_TOKEN)");
        }
        return absl::UnauthenticatedError(
            "the job API needs a bearer token (--auth-token-file or ADJSH_AUTH_TOKEN)");
    }
  }
  if (absl::StartsWith(ToAbsl(method), ToAbsl(kPeerService))) {  // a worker's, for its peers
    if (verified_client_cert) return absl::OkStatus();
    return absl::UnauthenticatedError(
        "a worker's peer endpoint needs a client certificate signed by the cluster's CA");
  }
  if (absl::StartsWith(ToAbsl(method), ToAbsl(kTaskService))) {
    if (verified_client_cert) return absl::OkStatus();
    if (token == TokenCheck::kValid) {
      return absl::PermissionDeniedError(
          "the job token does not grant the task API: workers authenticate with a client "
          "certificate signed by the coordinator's CA (--tls-cert, --tls-key)");
    }
    return absl::UnauthenticatedError(
        "the task API needs a client certificate signed by the coordinator's CA "
        "(adjsh worker --tls-cert, --tls-key)");
  }
  return absl::PermissionDeniedError(
      absl::StrCat("method ", ToAbsl(method), " is not served to remote callers"));
}

grpc::Status CoordinatorAuthProcessor::Process(const InputMetadata& auth_metadata,
                                               grpc::AuthContext* context, OutputMetadata*,
                                               OutputMetadata*) {
  std::string_view method;
  std::optional<std::string_view> authorization;
  for (const auto& [key, value] : auth_metadata) {
    const std::string_view k(key.data(), key.size()), v(value.data(), value.size());
    if (k == ":path") method = v;
    if (k == "authorization") {
      if (authorization.has_value()) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                            "more than one authorization header");
      }
      authorization = v;
    }
  }
  // IsPeerAuthenticated: a client certificate was presented and verified against the CA
  // during the handshake (its CN / SANs are the peer identity).
  const bool cert = context != nullptr && context->IsPeerAuthenticated();
  return ToGrpcStatus(AuthorizeCall(method, cert, authorization, job_token_));
}

}  // namespace adjsh
