// adjsh worker: owns spans of a coordinator's steps and serves their (layer, span) tasks over
// gRPC until SIGTERM or SIGINT (worker/worker.h); with --peer-listen, a node of the worker tree
// (worker/peer.h).
#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device_flags.h"
#include "cli/security_flags.h"
#include "cli/health_flags.h"
#include "cli/stop_signal.h"
#include "common/address.h"
#include "common/metrics_server.h"
#include "kernels/backend.h"
#include "worker/metrics.h"
#include "worker/worker.h"

namespace adjsh::cli {

int WorkerCommand(const std::vector<std::string>& args) {
  ArgParser a("worker",
              "Owns spans of an adjsh coordinator's steps and serves their (layer, span) tasks:\n"
              "registers with its TaskService, then pulls tasks, fetches their inputs, computes\n"
              "them (on the CPU, or on a GPU with --device cuda:N) and pushes the results, until\n"
              "SIGTERM or SIGINT (exit 0). A lost coordinator is retried forever (backoff up to\n"
              "2 s); a coordinator that refuses the worker's credentials (UNAUTHENTICATED,\n"
              "PERMISSION_DENIED) ends it with exit 1. With --peer-listen it also serves the\n"
              "worker tree: parameters relayed to the next worker, partial sums from others.\n"
              "With --tls-ca the connection is mutual TLS: the worker checks the coordinator's\n"
              "certificate against --tls-ca and presents --tls-cert (docs/SECURITY.md); without\n"
              "it, plaintext to a loopback coordinator started with --insecure-local.");
  a.Add("coordinator", "HOST:PORT", "the coordinator's TaskService address", "", true);
  a.Add("name", "NAME", "worker name shown by the coordinator (default: the host name)");
  AddHealthFlag(a, "once registered with its coordinator");
  a.Add("metrics-listen", "HOST:PORT",
        "serve Prometheus metrics on http://HOST:PORT/metrics (port 0: a free one, logged)");
  a.Add("log-every", "N", "progress line (tasks/s, RSS) every N finished tasks; 0: never", "100");
  a.AddBool("verbose", "also log every task and every retried RPC");
  a.AddBool("quiet", "log warnings and errors only");
  AddDeviceFlags(a, "compute the tasks");
  AddKeptFlag(a);
  AddDeviceMemFlag(a);
  a.Add("storage", "full|bf16",
        "with --device cuda:N: activations and weights held in bf16 on the GPU, sums in f32 "
        "(CUDA only; how a span's rows are kept is the job's --storage)",
        "full");
  a.Add("spill-dir", "DIR",
        "keep the owned spans' layer inputs in memory-mapped files here (the OS may write them "
        "to disk: spans larger than RAM); the same results");
  a.Add("peer-listen", "HOST:PORT",
        "serve the worker tree's peer endpoint here (port 0: a free one; unix:PATH): the "
        "parameters come down and the partials go up a tree of the workers instead of all "
        "through the coordinator. Plaintext on loopback; with --tls-ca it is mutual TLS with "
        "this worker's certificate, which must name the address peers use");
  a.Add("peer-advertise", "HOST:PORT",
        "the address peers reach the endpoint at (default: the --peer-listen address)");
  a.Add("peer-tls-name", "NAME",
        "with --tls-ca: the name (certificate SAN) every peer's certificate carries, checked "
        "instead of the host of its address (workers reached by IP sharing one name)");
  AddClientSecurityFlags(a, /*worker=*/true);
  if (auto code = ParseOrExit(a, args)) return *code;

  worker::WorkerOptions opt;
  opt.coordinator = a.Get("coordinator");
  if (opt.coordinator.empty()) {
    return BadUsage("worker", absl::InvalidArgumentError("--coordinator is empty"));
  }
  if (absl::Status s = CheckAddressFlag("coordinator", opt.coordinator, false); !s.ok())
    return BadUsage("worker", s);
  SecurityError security_error;
  absl::StatusOr<ClientSecurity> security =
      ClientSecurityFromFlags(a, opt.coordinator, /*worker=*/true, &security_error);
  if (!security.ok()) return SecurityFail("worker", security_error);
  opt.credentials = ChannelCredentialsFor(*security);
  opt.tls = !security->insecure;
  opt.coordinator_tls_name = security->server_name;
  if (a.Has("name")) opt.name = a.Get("name");
  for (const char* f : {"peer-advertise", "peer-tls-name"}) {
    if (a.Has(f) && !a.Has("peer-listen")) {
      return BadUsage("worker", absl::InvalidArgumentError(
                                    absl::StrCat("--", f, " needs --peer-listen")));
    }
  }
  if (a.Has("peer-listen")) {
    opt.peer_listen = a.Get("peer-listen");
    opt.peer_advertise = a.Get("peer-advertise");
    opt.peer_tls_name = a.Get("peer-tls-name");
    const bool unix_socket = opt.peer_listen.rfind("unix:", 0) == 0;
    if (absl::Status s = CheckAddressFlag("peer-listen", opt.peer_listen, true); !s.ok())
      return BadUsage("worker", absl::InvalidArgumentError(
                                    absl::StrCat(s.message(), " (or unix:PATH)")));
    if (security->insecure) {
      if (a.Has("peer-tls-name")) {
        return BadUsage("worker", absl::InvalidArgumentError("--peer-tls-name needs --tls-ca"));
      }
      if (!IsLoopbackAddress(opt.peer_listen)) {
        return BadUsage("worker", absl::InvalidArgumentError(absl::StrCat(
                                      "--peer-listen ", opt.peer_listen,
                                      " is not a loopback address: serve it with TLS (--tls-ca, "
                                      "--tls-cert, --tls-key)")));
      }
    } else {
      ServerSecurity peer;
      peer.tls = security->tls;
      opt.peer_credentials = ServerCredentialsFor(peer);
    }
    if (opt.peer_advertise.empty() && !unix_socket &&
        (absl::StartsWith(opt.peer_listen, "0.0.0.0:") ||
         absl::StartsWith(opt.peer_listen, "[::]:"))) {
      return BadUsage("worker", absl::InvalidArgumentError(
                                    "--peer-listen on every interface needs --peer-advertise "
                                    "(the address peers reach this worker at)"));
    }
  }
  if (a.Has("spill-dir")) {
    opt.spill_dir = a.Get("spill-dir");
    if (access(opt.spill_dir.c_str(), W_OK | X_OK) != 0) {
      return BadUsage("worker", absl::InvalidArgumentError(absl::StrCat(
                                    "--spill-dir ", opt.spill_dir,
                                    " does not exist or is not writable")));
    }
  }
  absl::StatusOr<int64_t> log_every = a.GetInt("log-every", 0, int64_t{1} << 40);
  if (!log_every.ok()) return BadUsage("worker", log_every.status());
  opt.log_every = *log_every;
  if (a.GetBool("verbose") && a.GetBool("quiet")) {
    return BadUsage("worker",
                    absl::InvalidArgumentError("--verbose and --quiet exclude each other"));
  }
  opt.log_level = a.GetBool("verbose") ? 2 : a.GetBool("quiet") ? 0 : 1;
  absl::StatusOr<Device> device = DeviceFromFlags(a);
  if (!device.ok()) return BadUsage("worker", device.status());
  opt.device = *device;
  absl::StatusOr<Storage> storage = StorageFromFlags(a);
  if (!storage.ok()) return BadUsage("worker", storage.status());
  opt.device.bf16_storage = *storage == Storage::kBF16;  // the CPU backend refuses it, clearly
  if (absl::Status s = CheckDeviceUsable(opt.device); !s.ok()) return Fail("worker", s);

  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (a.Has("metrics-listen")) {
    const std::string listen = a.Get("metrics-listen");
    if (absl::Status s = CheckHostPort("metrics-listen", listen); !s.ok()) {
      return BadUsage("worker", s);
    }
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> started =
        metrics::MetricsServer::Start(listen);
    if (!started.ok()) return Fail("worker", started.status());
    metrics_server = std::move(*started);
    // The GPU gauges come from this backend's memory probe. It reads the device's counts, kept
    // for the process's life and shared by every backend of the device: it sees what the
    // worker's own backend allocates, and stays valid after this backend and the worker end.
    absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(opt.device);
    if (!backend.ok()) return Fail("worker", backend.status());
    auto m = std::make_shared<worker::WorkerMetrics>(worker::MetricsOptionsFor(opt.name,
                                                                               **backend));
    opt.metrics = m.get();  // kept alive by the server, which outlives the worker below
    metrics_server->Add(std::move(m));
    std::fprintf(stderr, "metrics on %s\n", metrics_server->address().c_str());
  }

  absl::StatusOr<std::unique_ptr<HealthServer>> health = StartHealth(a);
  if (!health.ok()) {
    return absl::IsInvalidArgument(health.status()) ? BadUsage("worker", health.status())
                                                    : Fail("worker", health.status());
  }
  opt.health = health->get();  // SERVING once registered; outlives the worker below
  std::atomic<bool>& stop = InstallStopSignals();
  worker::Worker w(opt);
  const absl::Status status = w.Run(stop);
  if (!opt.device.is_cpu() && opt.log_level >= 1) {
    // The device's counts outlive the worker's backends (kernels/cuda/context.h MemoryCountsOf).
    absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(opt.device);
    if (backend.ok()) {
      if (std::optional<DeviceMemoryUsage> use = (*backend)->MemoryProbe()()) {
        std::fprintf(stderr, "worker: %s held at most %.2f MiB of device memory\n",
                     opt.device.ToString().c_str(),
                     static_cast<double>(use->peak_bytes) / 1048576.0);
        const DeviceTraffic& t = use->traffic;
        std::fprintf(stderr,
                     "worker: %s copied %llu B to the device and %llu B back (%llu copies, "
                     "%llu syncs)\n",
                     opt.device.ToString().c_str(), static_cast<unsigned long long>(t.h2d_bytes),
                     static_cast<unsigned long long>(t.d2h_bytes),
                     static_cast<unsigned long long>(t.h2d_copies + t.d2h_copies),
                     static_cast<unsigned long long>(t.syncs));
      }
    }
  }
  return status.ok() ? 0 : Fail("worker", status);
}

}  // namespace adjsh::cli
