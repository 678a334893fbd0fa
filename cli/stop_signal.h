// SIGTERM / SIGINT handling for the long-running commands (coordinator, worker): the first
// signal sets the returned flag (the command stops cleanly and exits 0); a second one while it
// is stopping ends the process at once with 128 + the signal number.
#ifndef ADJSH_CLI_STOP_SIGNAL_H_
#define ADJSH_CLI_STOP_SIGNAL_H_

#include <atomic>

namespace adjsh::cli {

std::atomic<bool>& InstallStopSignals();

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_STOP_SIGNAL_H_
