// The data tools of scripts/adjsh_data.py (Hugging Face `tokenizers`), run with the project
// venv's Python (scripts/setup-venv.sh): found from this build's source tree, or from
// $ADJSH_DATA_TOOL and $ADJSH_PYTHON (an installed adjsh).
#ifndef ADJSH_CLI_DATA_TOOL_H_
#define ADJSH_CLI_DATA_TOOL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace adjsh::cli {

// Replaces this process with `python adjsh_data.py args...`; returns (exit code 1, with the
// reason on stderr) only when that cannot be done.
int ExecDataTool(const std::string& command, const std::vector<std::string>& args);

// Runs `python adjsh_data.py args...` and returns its stdout; its stderr passes through.
// FAILED_PRECONDITION when the tool or the venv is missing, INTERNAL when it exits non-zero.
absl::StatusOr<std::string> RunDataTool(const std::vector<std::string>& args);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_DATA_TOOL_H_
