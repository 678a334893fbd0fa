// adjsh coordinator: serves the TaskService (workers) and the JobService (adjsh submit / status /
// watch / cancel) on one gRPC address, with mutual TLS and a job token (cli/security_flags.h) or
// plaintext on loopback, until SIGTERM or SIGINT (coordinator/job_service.h).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/health_flags.h"
#include "cli/device_flags.h"
#include "cli/security_flags.h"
#include "cli/stop_signal.h"
#include "common/address.h"
#include "common/metrics_server.h"
#include "coordinator/job_service.h"
#include "coordinator/metrics.h"
#include "coordinator/task_service.h"
#include "grpcpp/grpcpp.h"
#include "proto/transport.h"

namespace adjsh::cli {

namespace {

// The state directory, made if missing, and held for this process: an exclusive flock on
// DIR/coordinator.lock (released by the kernel however the process ends). A second coordinator
// on the same directory ran beside the first and rewrote its job records (a job the first had
// finished went back to RUNNING); now it is refused. The descriptor, or an error naming DIR.
absl::StatusOr<int> HoldStateDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create --state-dir ", dir, ": ", ec.message()));
  }
  const std::string lock = (std::filesystem::path(dir) / "coordinator.lock").string();
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--state-dir ", dir, " is not writable (", lock, "): ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::FailedPreconditionError(
        error == EWOULDBLOCK
            ? absl::StrCat("--state-dir ", dir, " is in use by another coordinator (it holds ",
                           lock, ")")
            : absl::StrCat("cannot lock ", lock, ": ", std::strerror(error)));
  }
  return fd;
}

// The command that connects a worker to this coordinator, serving on `address` (HOST:PORT), for
// the start-up line and the note that a job waits for workers. A wildcard host (0.0.0.0, [::])
// is no address to reach, so it reads HOST; with TLS the worker's flags are named.
std::string WorkerCommand(const std::string& address, bool tls) {
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") host = "HOST";
  return absl::StrCat("adjsh worker --coordinator ", host, address.substr(colon),
                      tls ? " --tls-ca CA.pem --tls-cert CERT.pem --tls-key KEY.pem" : "");
}

}  // namespace

int CoordinatorCommand(const std::vector<std::string>& args) {
  ArgParser a(
      "coordinator",
      "Serves adjsh's distributed training on one gRPC address: the TaskService that\n"
      "`adjsh worker --coordinator ADDR` processes pull a step's (layer, span) tasks from,\n"
      "and the JobService that `adjsh submit / status / watch / cancel` talk to. Jobs run one at\n"
      "a time in submission order; each trains as `adjsh train` does (AdamW here; the forward,\n"
      "LM head and backward on the connected workers), with bitwise the same weights. Prints\n"
      "'listening on HOST:PORT' on stdout once serving (--listen with port 0 picks a free port).\n"
      "A job's paths must lie under --state-dir or a --data-root (relative ones are taken in\n"
      "--state-dir); files are written readable by this user only.\n"
      "Jobs are recorded in --state-dir (jobs/JOB_ID.json): started again with the same state\n"
      "dir, the coordinator runs its queued and interrupted jobs on by itself, each from its\n"
      "latest checkpoint, with the weights of an undisturbed run; old job ids stay valid.\n"
      "SIGTERM or SIGINT stops the running job after its last completed step, checkpoints it,\n"
      "and exits 0.\n"
      "Security (docs/SECURITY.md): TLS with --tls-cert/--tls-key; workers must present a\n"
      "client certificate signed by --tls-ca; the job API requires the bearer token of\n"
      "--auth-token-file (or ADJSH_AUTH_TOKEN). --insecure-local instead serves plaintext\n"
      "without authentication, on a loopback address only.\n"
      "Limits: a job over --max-context, --max-layers, --max-hidden, --max-tensor-bytes,\n"
      "--max-model-bytes or --max-data-bytes is refused at submit (INVALID_ARGUMENT naming the\n"
      "limit); messages over --max-message-bytes are refused (RESOURCE_EXHAUSTED).");
  a.Add("listen", "HOST:PORT", "address to serve on (port 0: a free port)", "127.0.0.1:50051");
  a.Add("state-dir", "DIR",
        "checkpoints of jobs submitted without a checkpoint dir go to DIR/JOB_ID",
        "adjsh-coordinator");
  a.Add("data-root", "DIR[,DIR...]",
        "directories whose files jobs may read (models, tokens, text) and where they may write "
        "checkpoints, besides --state-dir; any other path in a spec is PERMISSION_DENIED");
  a.Add("trace", "FILE",
        "append one JSON line per span task of every step of one sequence (bench/fleet_sim.py "
        "replays them)");
  a.Add("lease-ms", "MS", "a task's lease; a lost worker's task is handed out again after it",
        "5000");
  AddReduceFlag(a, "");
  a.Add("threads", "N", "threads for the forward pass and LM head here (0: one per core)", "0");
  AddHealthFlag(a, "once it serves");
  a.Add("metrics-listen", "HOST:PORT",
        "serve Prometheus metrics on http://HOST:PORT/metrics (port 0: a free one, logged)");
  a.AddBool("quiet", "do not log job state changes on stderr");
  AddServerSecurityFlags(a);
  AddLimitFlags(a);
  if (auto code = ParseOrExit(a, args)) return *code;

  const std::string listen = a.Get("listen");
  if (absl::Status s = CheckAddressFlag("listen", listen, /*listen=*/true); !s.ok())
    return BadUsage("coordinator", s);
  absl::StatusOr<int64_t> lease_ms = a.GetInt("lease-ms", 100, int64_t{1} << 31);
  if (!lease_ms.ok()) return BadUsage("coordinator", lease_ms.status());
  absl::StatusOr<int64_t> threads = a.GetInt("threads", 0, 4096);
  if (!threads.ok()) return BadUsage("coordinator", threads.status());
  if (a.Has("metrics-listen")) {
    if (absl::Status s = CheckHostPort("metrics-listen", a.Get("metrics-listen"));
        !s.ok())
      return BadUsage("coordinator", s);
  }
  absl::StatusOr<CoordinatorLimits> limits = LimitsFromFlags(a);
  if (!limits.ok()) return BadUsage("coordinator", limits.status());
  SecurityError security_error;
  absl::StatusOr<ServerSecurity> security =
      ServerSecurityFromFlags(a, listen, &security_error);
  if (!security.ok()) return SecurityFail("coordinator", security_error);

  std::error_code ec;
  if (a.Get("state-dir").empty()) {  // the jobs' records and default checkpoints would go nowhere
    return BadUsage("coordinator", absl::InvalidArgumentError("--state-dir must name a directory"));
  }
  const std::string state_dir = std::filesystem::absolute(a.Get("state-dir"), ec).string();
  if (std::filesystem::exists(state_dir, ec) && !std::filesystem::is_directory(state_dir, ec)) {
    return Fail("coordinator", absl::FailedPreconditionError(absl::StrCat(
                                   "--state-dir ", state_dir, " exists and is not a directory")));
  }

  std::vector<std::string> data_roots;
  if (a.Has("data-root")) {
    const std::vector<std::string> dirs = absl::StrSplit(a.Get("data-root"), ',', absl::SkipEmpty());
    for (const std::string& dir : dirs) {
      const std::string abs = std::filesystem::absolute(dir, ec).string();
      if (!std::filesystem::is_directory(abs, ec)) {
        return Fail("coordinator", absl::NotFoundError(absl::StrCat(
                                       "--data-root ", abs, " is not a directory")));
      }
      data_roots.push_back(abs);
    }
  }
  // Checkpoints and everything else the coordinator writes: readable by its own user only.
  ::umask(077);
  const absl::StatusOr<int> state_lock = HoldStateDir(state_dir);  // held until the process ends
  if (!state_lock.ok()) return Fail("coordinator", state_lock.status());
  coordinator::LimitMallocArenasForServing();

  coordinator::TaskServiceOptions task_options;
  task_options.lease = absl::Milliseconds(*lease_ms);
  task_options.trace_path = a.Get("trace");
  absl::StatusOr<bool> tree = ReduceFromFlags(a);
  if (!tree.ok()) return BadUsage("coordinator", tree.status());
  task_options.worker_tree = *tree;
  coordinator::TaskServiceImpl tasks(task_options);
  auto job_metrics = std::make_shared<coordinator::CoordinatorMetrics>(&tasks);
  coordinator::JobServiceImpl jobs(tasks, {.state_dir = state_dir,
                                           .threads = static_cast<int>(*threads),
                                           .log = !a.GetBool("quiet"),
                                           .observer = job_metrics.get(),
                                           .limits = limits->job,
                                           .data_roots = data_roots,
                                           .max_reply_bytes = static_cast<size_t>(
                                               limits->max_message_bytes / 2)});
  job_metrics->set_jobs(&jobs);
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (a.Has("metrics-listen")) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> started =
        metrics::MetricsServer::Start(a.Get("metrics-listen"));
    if (!started.ok()) return Fail("coordinator", started.status());
    metrics_server = std::move(*started);
    metrics_server->Add(job_metrics);
    std::fprintf(stderr, "metrics on %s\n", metrics_server->address().c_str());
  }
  absl::StatusOr<std::unique_ptr<HealthServer>> health = StartHealth(a);
  if (!health.ok()) {
    return absl::IsInvalidArgument(health.status()) ? BadUsage("coordinator", health.status())
                                                    : Fail("coordinator", health.status());
  }
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, ServerCredentialsFor(*security), &port);
  builder.RegisterService(&tasks);
  builder.RegisterService(&jobs);
  HealthService main_health;  // the same status on the main port, under its TLS
  builder.RegisterService(&main_health);
  ConfigureServer(builder, limits->max_message_bytes);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail("coordinator", absl::UnavailableError(absl::StrCat(
                                   "cannot listen on ", listen,
                                   " (address in use, or not an address of this machine)")));
  }
  const std::string address = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  const std::string worker_command = WorkerCommand(address, !security->insecure);
  jobs.SetWorkerCommand(worker_command);
  if (*health) (*health)->SetServing(true);
  main_health.SetServing(true);
  std::atomic<bool>& stop = InstallStopSignals();
  std::printf("listening on %s\n", address.c_str());
  std::fflush(stdout);
  std::fprintf(stderr,
               "adjsh coordinator on %s (%s): workers connect with `%s`; default checkpoints "
               "under %s\n",
               address.c_str(),
               security->insecure ? "plaintext, no authentication" : "mutual TLS, job token",
               worker_command.c_str(), state_dir.c_str());

  while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::fprintf(stderr, "adjsh coordinator: stopping\n");
  if (*health) (*health)->SetServing(false);
  main_health.SetServing(false);
  main_health.Stop();  // its Watch calls end, so the server's shutdown does not wait on them
  jobs.Shutdown();  // checkpoints the running job at its last completed step; it stays recorded
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace adjsh::cli
