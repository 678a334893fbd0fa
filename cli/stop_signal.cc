#include "cli/stop_signal.h"

#include <signal.h>
#include <unistd.h>

namespace adjsh::cli {
namespace {

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

void OnSignal(int sig) {
  if (g_stop.exchange(true)) _exit(128 + sig);
}

}  // namespace

std::atomic<bool>& InstallStopSignals() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  return g_stop;
}

}  // namespace adjsh::cli
