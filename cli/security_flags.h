// The TLS, authentication and limit flags of adjsh's gRPC commands (docs/SECURITY.md), and what
// they turn into (proto/credentials.h, coordinator/job_spec.h's JobLimits).
//   coordinator:  --tls-cert --tls-key --tls-ca --auth-token-file (or ADJSH_AUTH_TOKEN), or
//                 --insecure-local (plaintext, no authentication, loopback listen address only)
//   clients:      --tls-ca [--tls-cert --tls-key] [--auth-token-file]; without --tls-ca the
//                 channel is plaintext, for loopback coordinators only
#ifndef ADJSH_CLI_SECURITY_FLAGS_H_
#define ADJSH_CLI_SECURITY_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "cli/args.h"
#include "coordinator/job_spec.h"
#include "proto/credentials.h"

namespace adjsh::cli {

// A flag error: `usage` tells bad usage (exit 2: missing or conflicting flags) from bad input
// (exit 1: unreadable or invalid certificate, key or token files).
struct SecurityError {
  absl::Status status;
  bool usage = false;
};

void AddServerSecurityFlags(ArgParser& a);
// listen: the --listen address (checked against --insecure-local).
absl::StatusOr<ServerSecurity> ServerSecurityFromFlags(const ArgParser& a,
                                                       const std::string& listen,
                                                       SecurityError* error);

// worker = true: the help speaks of the worker's client certificate, and there is no
// --auth-token-file (workers authenticate with their certificate).
void AddClientSecurityFlags(ArgParser& a, bool worker);
absl::StatusOr<ClientSecurity> ClientSecurityFromFlags(const ArgParser& a,
                                                       const std::string& coordinator,
                                                       bool worker, SecurityError* error);

// The coordinator's limits: --max-context, --max-layers, --max-hidden, --max-tensor-bytes (per
// job, checked at submit) and --max-message-bytes (gRPC, >= 2 MiB).
struct CoordinatorLimits {
  coordinator::JobLimits job;
  int max_message_bytes = 0;
};
void AddLimitFlags(ArgParser& a);
absl::StatusOr<CoordinatorLimits> LimitsFromFlags(const ArgParser& a);  // error: bad usage

// Exits as the error says: BadUsage (2) or Fail (1).
int SecurityFail(const std::string& command, const SecurityError& error);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_SECURITY_FLAGS_H_
