// --health-listen (cli/health_flags.h) and `adjsh health ADDRESS`: one gRPC health check.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/health_flags.h"
#include "common/address.h"

namespace adjsh::cli {

void AddHealthFlag(ArgParser& a, const std::string& when) {
  a.Add("health-listen", "HOST:PORT",
        "serve the gRPC health service (grpc.health.v1, plaintext, nothing else on the port) "
        "for probes: SERVING " + when + ", NOT_SERVING while stopping (port 0: a free one, "
        "logged)");
}

absl::StatusOr<std::unique_ptr<HealthServer>> StartHealth(const ArgParser& a) {
  if (!a.Has("health-listen")) return std::unique_ptr<HealthServer>();
  const std::string listen = a.Get("health-listen");
  if (absl::Status s = CheckHostPort("health-listen", listen); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<HealthServer>> h = HealthServer::Start(listen);
  if (!h.ok()) return h.status();
  std::fprintf(stderr, "health on %s\n", (*h)->address().c_str());
  return h;
}

int HealthCommand(const std::vector<std::string>& args) {
  ArgParser a("health",
              "Asks a coordinator's or a worker's health endpoint (--health-listen) for its\n"
              "status with one gRPC health check (grpc.health.v1.Health/Check): prints SERVING\n"
              "or NOT_SERVING and exits 0 only for SERVING.");
  a.Add("address", "HOST:PORT", "the --health-listen address", "", true);
  a.Add("service", "NAME", "the service asked about (\"\" or adjsh: the process)", "");
  a.Add("timeout", "S", "seconds to wait for the answer", "3");
  if (auto code = ParseOrExit(a, args)) return *code;
  absl::StatusOr<double> timeout = a.GetDouble("timeout");
  if (!timeout.ok() || !(*timeout > 0)) {
    return BadUsage("health", absl::InvalidArgumentError("--timeout must be a positive number"));
  }
  if (absl::Status s = CheckAddressFlag("address", a.Get("address"), false); !s.ok())
    return BadUsage("health", s);
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> s =
      CheckHealth(a.Get("address"), a.Get("service"), *timeout);
  if (!s.ok()) {
    return Fail("health", absl::Status(s.status().code(),
                                       absl::StrCat("no answer from ", a.Get("address"), ": ",
                                                    s.status().message())));
  }
  std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*s).c_str());
  return *s == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace adjsh::cli
