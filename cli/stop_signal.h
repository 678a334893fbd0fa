// SIGTERM / SIGINT handling for the long-running commands: the first signal sets the returned
// flag, and the command stops cleanly (coordinator and worker exit 0; train saves the step under
// way and exits 1, cli/train_cmd.cc); a second one while it is stopping ends the process at
// once with 128 + the signal number.
#ifndef ADJSH_CLI_STOP_SIGNAL_H_
#define ADJSH_CLI_STOP_SIGNAL_H_

#include <atomic>

namespace adjsh::cli {

std::atomic<bool>& InstallStopSignals();

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_STOP_SIGNAL_H_
