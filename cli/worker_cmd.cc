// adjsh worker: serves exact-backward (layer, chunk) tasks of a coordinator over gRPC until
// SIGTERM or SIGINT (worker/worker.h).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "worker/worker.h"

namespace adjsh::cli {
namespace {

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

// The first signal asks the worker to stop (it finishes or drops its task, then exits 0); a
// second one while it is stopping ends the process at once.
void OnSignal(int sig) {
  if (g_stop.exchange(true)) _exit(128 + sig);
}

void InstallSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

}  // namespace

int WorkerCommand(const std::vector<std::string>& args) {
  ArgParser a("worker",
              "Serves exact-backward (layer, chunk) tasks of an adjsh coordinator: registers with\n"
              "its TaskService (insecure gRPC), then pulls tasks, fetches their inputs, computes\n"
              "them on the CPU and pushes the results, until SIGTERM or SIGINT (exit 0). A lost\n"
              "coordinator is retried forever (backoff up to 2 s).");
  a.Add("coordinator", "HOST:PORT", "the coordinator's TaskService address", "", true);
  a.Add("name", "NAME", "worker name shown by the coordinator (default: the host name)");
  a.Add("log-every", "N", "progress line (tasks/s, RSS) every N finished tasks; 0: never", "100");
  a.AddBool("verbose", "also log every task and every retried RPC");
  a.AddBool("quiet", "log warnings and errors only");
  if (auto code = ParseOrExit(a, args)) return *code;

  worker::WorkerOptions opt;
  opt.coordinator = a.Get("coordinator");
  if (opt.coordinator.empty()) {
    return BadUsage("worker", absl::InvalidArgumentError("--coordinator is empty"));
  }
  if (a.Has("name")) opt.name = a.Get("name");
  absl::StatusOr<int64_t> log_every = a.GetInt("log-every", 0, int64_t{1} << 40);
  if (!log_every.ok()) return BadUsage("worker", log_every.status());
  opt.log_every = *log_every;
  if (a.GetBool("verbose") && a.GetBool("quiet")) {
    return BadUsage("worker",
                    absl::InvalidArgumentError("--verbose and --quiet exclude each other"));
  }
  opt.log_level = a.GetBool("verbose") ? 2 : a.GetBool("quiet") ? 0 : 1;

  InstallSignalHandlers();
  worker::Worker w(opt);
  const absl::Status status = w.Run(g_stop);
  return status.ok() ? 0 : Fail("worker", status);
}

}  // namespace adjsh::cli
