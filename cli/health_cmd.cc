// --health-listen (cli/health_flags.h) and `adjsh health ADDRESS`: one gRPC health check, of
// the plaintext health port or (with --tls-ca) a main port.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/health_flags.h"
#include "common/address.h"
#include "proto/credentials.h"

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
              "Asks a coordinator or a worker for its status with one gRPC health check\n"
              "(grpc.health.v1.Health/Check), on its --health-listen port (plaintext) or, with\n"
              "--tls-ca, on its main port (the coordinator's --listen, a worker's\n"
              "--peer-listen): prints SERVING or NOT_SERVING and exits 0 only for SERVING.");
  a.Add("address", "HOST:PORT", "the --health-listen address, or a main port with --tls-ca", "",
        true);
  a.Add("service", "NAME", "the service asked about (\"\" or adjsh: the process)", "");
  a.Add("timeout", "S", "seconds to wait for the answer", "3");
  a.Add("tls-ca", "FILE", "TLS: the CA that signed the server's certificate (a main port)", "");
  a.Add("tls-cert", "FILE", "TLS: a client certificate to present (not needed)", "");
  a.Add("tls-key", "FILE", "TLS: its private key", "");
  a.Add("tls-server-name", "NAME",
        "TLS: the name the server's certificate must carry (default: the host dialled)", "");
  if (auto code = ParseOrExit(a, args)) return *code;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (a.Has("tls-cert") != a.Has("tls-key")) {
    return BadUsage("health", absl::InvalidArgumentError("--tls-cert and --tls-key go together"));
  }
  if ((a.Has("tls-cert") || a.Has("tls-server-name")) && !a.Has("tls-ca")) {
    return BadUsage("health", absl::InvalidArgumentError(
                                  "--tls-cert and --tls-server-name need --tls-ca"));
  }
  if (a.Has("tls-ca")) {
    absl::StatusOr<TlsMaterial> tls =
        LoadTlsFiles({a.Get("tls-cert"), a.Get("tls-key"), a.Get("tls-ca")});
    if (!tls.ok()) return Fail("health", tls.status());
    ClientSecurity security;
    security.tls = *tls;
    credentials = ChannelCredentialsFor(security);
  }
  absl::StatusOr<double> timeout = a.GetDouble("timeout");
  if (!timeout.ok() || !(*timeout > 0)) {
    return BadUsage("health", absl::InvalidArgumentError("--timeout must be a positive number"));
  }
  if (absl::Status s = CheckAddressFlag("address", a.Get("address"), false); !s.ok())
    return BadUsage("health", s);
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> s =
      CheckHealth(a.Get("address"), a.Get("service"), *timeout, credentials,
                  a.Get("tls-server-name"));
  if (!s.ok()) {
    return Fail("health", absl::Status(s.status().code(),
                                       absl::StrCat("no answer from ", a.Get("address"), ": ",
                                                    s.status().message())));
  }
  std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*s).c_str());
  return *s == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace adjsh::cli
