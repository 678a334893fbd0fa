#include "cli/data_tool.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

#ifndef ADJSH_SOURCE_DIR
#define ADJSH_SOURCE_DIR "."
#endif

namespace adjsh::cli {
namespace {

std::string FromEnv(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// A program name without a '/' looked up on PATH, as a shell would; the name itself if absent.
std::string OnPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const std::string path = FromEnv("PATH", "/usr/bin:/bin");
  for (size_t start = 0; start <= path.size();) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string candidate = path.substr(start, end - start) + "/" + name;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return name;
}

// {python, tool} or FAILED_PRECONDITION naming what is missing. Without the project venv (and
// no ADJSH_PYTHON) the system's python3 runs the tool: its --help and its checks of the paths
// it is given need only the standard library, and it says itself when the tokenizers package
// is what is missing.
absl::StatusOr<std::vector<std::string>> Paths() {
  const std::string set = FromEnv("ADJSH_PYTHON", "");
  std::string python = set.empty() ? ADJSH_SOURCE_DIR "/.venv/bin/python" : OnPath(set);
  if (set.empty() && ::access(python.c_str(), X_OK) != 0 &&
      ::access("/usr/bin/python3", X_OK) == 0)
    python = "/usr/bin/python3";
  const std::string tool = FromEnv("ADJSH_DATA_TOOL", ADJSH_SOURCE_DIR "/scripts/adjsh_data.py");
  for (const std::string& path : {python, tool}) {
    if (::access(path.c_str(), R_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " is missing: run scripts/setup-venv.sh (the project venv with Hugging Face "
          "tokenizers), or set ADJSH_PYTHON and ADJSH_DATA_TOOL"));
    }
  }
  return std::vector<std::string>{python, tool};
}

std::vector<char*> Argv(std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

}  // namespace

int ExecDataTool(const std::string& command, const std::vector<std::string>& args) {
  absl::StatusOr<std::vector<std::string>> cmd = Paths();
  if (!cmd.ok()) {
    std::fprintf(stderr, "adjsh %s: error: %s\n", command.c_str(),
                 std::string(cmd.status().message()).c_str());
    return 1;
  }
  cmd->insert(cmd->end(), args.begin(), args.end());
  std::vector<char*> argv = Argv(*cmd);
  ::execv(argv[0], argv.data());
  std::fprintf(stderr, "adjsh %s: error: cannot run %s: %s\n", command.c_str(), argv[0],
               std::strerror(errno));
  return 1;
}

absl::StatusOr<std::string> RunDataTool(const std::vector<std::string>& args) {
  absl::StatusOr<std::vector<std::string>> cmd = Paths();
  if (!cmd.ok()) return cmd.status();
  cmd->insert(cmd->end(), args.begin(), args.end());
  int fds[2];
  if (::pipe(fds) != 0) return absl::ErrnoToStatus(errno, "pipe");
  std::vector<char*> argv = Argv(*cmd);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::ErrnoToStatus(errno, "fork");
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("scripts/adjsh_data.py ", args.empty() ? "" : args[0],
                                            " failed (its error is above)"));
  }
  return out;
}

}  // namespace adjsh::cli
