#include "coordinator/local_cluster.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace adjsh::coordinator {

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(int workers,
                                                                  const std::string& exe,
                                                                  TaskServiceOptions options,
                                                                  std::string worker_metrics) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->exe_ = exe;
  if (!worker_metrics.empty()) {
    const size_t colon = worker_metrics.rfind(':');
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(worker_metrics.substr(colon + 1), &c->metrics_port_) ||
        c->metrics_port_ < 0 || c->metrics_port_ + workers - 1 > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker metrics address must be HOST:PORT with room for ", workers, " ports, got '",
          worker_metrics, "'"));
    }
    c->metrics_host_ = worker_metrics.substr(0, colon);
  }
  c->service_ = std::make_unique<TaskServiceImpl>(options);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(c->service_.get());
  builder.SetMaxReceiveMessageSize(8 << 20);
  c->server_ = builder.BuildAndStart();
  if (!c->server_ || port == 0) {
    return absl::UnavailableError("cannot start the coordinator's server on 127.0.0.1");
  }
  c->address_ = absl::StrCat("127.0.0.1:", port);
  for (int w = 0; w < workers; ++w) {
    const pid_t pid = c->Spawn(w);
    if (pid < 0) return absl::InternalError("cannot start a worker process");
    c->pids_.push_back(pid);
  }
  c->supervisor_ = std::thread([raw = c.get()] { raw->Supervise(); });
  return c;
}

pid_t LocalCluster::Spawn(int slot) const {
  const std::string name = absl::StrCat("local-", slot);
  std::vector<std::string> args = {exe_, "worker", "--coordinator", address_, "--name", name};
  if (!metrics_host_.empty()) {
    args.push_back("--metrics-listen");
    args.push_back(absl::StrCat(metrics_host_, ":", metrics_port_ > 0 ? metrics_port_ + slot : 0));
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a worker never outlives its coordinator process
    execv(exe_.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

void LocalCluster::Supervise() {
  while (!stopping_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t w = 0; w < pids_.size(); ++w) {
      int status = 0;
      if (pids_[w] <= 0 || waitpid(pids_[w], &status, WNOHANG) != pids_[w]) continue;
      if (stopping_.load()) break;
      std::fprintf(stderr, "worker %zu (pid %d) %s %d; starting it again\n", w, pids_[w],
                   WIFSIGNALED(status) ? "killed by signal" : "exited with status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      pids_[w] = Spawn(static_cast<int>(w));
      restarts_.fetch_add(1);
    }
  }
}

std::vector<pid_t> LocalCluster::worker_pids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pids_;
}

LocalCluster::~LocalCluster() {
  stopping_.store(true);
  if (supervisor_.joinable()) supervisor_.join();
  std::vector<pid_t> pids = worker_pids();
  for (pid_t pid : pids)
    if (pid > 0) kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (pid_t pid : pids) {
    if (pid <= 0) continue;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace adjsh::coordinator
