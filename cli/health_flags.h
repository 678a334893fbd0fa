// --health-listen on the coordinator and the worker (proto/health.h), and `adjsh health`.
#ifndef ADJSH_CLI_HEALTH_FLAGS_H_
#define ADJSH_CLI_HEALTH_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/args.h"
#include "proto/health.h"

namespace adjsh::cli {

// when: when the process reports SERVING ("once it serves", ...).
void AddHealthFlag(ArgParser& a, const std::string& when);

// The health server of --health-listen (logged as 'health on HOST:PORT'), or null without the
// flag; UNAVAILABLE or INVALID_ARGUMENT for an address it cannot serve.
absl::StatusOr<std::unique_ptr<HealthServer>> StartHealth(const ArgParser& a);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_HEALTH_FLAGS_H_
