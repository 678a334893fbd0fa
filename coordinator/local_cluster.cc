#include "coordinator/local_cluster.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "kernels/cpu/kept_pool.h"
#include "proto/transport.h"

namespace adjsh::coordinator {
namespace {

// Removes base/adjsh-cluster-* directories of this user whose owner process is gone.
void RemoveDeadClusterDirs(const std::string& base) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("adjsh-cluster-", 0) != 0 || !e.is_directory(ec)) continue;
    struct stat st;
    if (::lstat(e.path().c_str(), &st) != 0 || st.st_uid != ::getuid()) continue;
    absl::StatusOr<std::string> owner = ReadFileToString((e.path() / "owner").string(),
                                                         {.regular_only = true, .max_bytes = 32});
    int64_t pid = 0;
    if (owner.ok() && absl::SimpleAtoi(*owner, &pid) && ProcessIsGone(pid))
      std::filesystem::remove_all(e.path(), ec);
  }
}

// The last `lines` lines of a file (fewer if it is shorter; "" if it cannot be read).
std::string Tail(const std::string& path, int lines) {
  absl::StatusOr<std::string> text = ReadFileToString(path, {.regular_only = true});
  if (!text.ok()) return "";
  std::string t = *std::move(text);
  while (!t.empty() && t.back() == '\n') t.pop_back();
  size_t start = t.size();
  for (int n = 0; n < lines && start > 0; ++n) {
    const size_t nl = t.rfind('\n', start - 1);
    start = nl == std::string::npos ? 0 : nl;
  }
  return t.substr(start == 0 ? 0 : start + 1);
}

}  // namespace

std::string LocalCluster::LogPath(int slot) const {
  return log_dir_.empty() ? "" : absl::StrCat(log_dir_, "/worker-", slot, ".log");
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(int workers,
                                                                  const std::string& exe,
                                                                  LocalClusterOptions options) {
  LimitMallocArenasForServing();  // the process serves the workers from here on
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->exe_ = exe;
  c->devices_ = std::move(options.worker_devices);
  const std::string& worker_metrics = options.worker_metrics;
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
  c->service_options_worker_tree_ = options.service.worker_tree;
  c->kept_budget_ = options.kept_budget;
  c->row_budget_ = options.row_budget;
  if (!options.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.log_dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot create the worker log directory ", options.log_dir, ": ", ec.message()));
    }
    c->log_dir_ = options.log_dir;
  }
  c->service_ = std::make_unique<TaskServiceImpl>(options.service);
  // mkdtemp creates the directory with mode 0700: the socket in it is reachable by this user
  // only. Socket paths are limited to 107 bytes, hence a short fallback for a long $TMPDIR.
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  if (base.size() > 64) base = "/tmp";
  RemoveDeadClusterDirs(base);
  std::string dir = base + "/adjsh-cluster-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot create a private directory for the "
                                               "cluster's socket under ", base, ": ",
                                               std::strerror(errno)));
  }
  // Its owner, so that a later cluster can remove it if this process is killed (SIGKILL runs
  // no destructor).
  if (absl::Status s = WriteFileAtomic(dir + "/owner", std::to_string(::getpid())); !s.ok())
    return s;
  c->socket_dir_ = dir;
  c->address_ = absl::StrCat("unix:", dir, "/coordinator");
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(c->address_, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(c->service_.get());
  ConfigureServer(builder, kDefaultMaxMessageBytes);  // keepalive, message limits
  c->server_ = builder.BuildAndStart();
  if (!c->server_ || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the coordinator's server on ", c->address_));
  }
  // One core per worker when there are enough: a worker's compute thread then keeps its core's
  // caches (docs/BENCHMARKS.md). The coordinator's threads stay free to run anywhere.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &allowed)) c->cpus_.push_back(cpu);
  }
  if (static_cast<int>(c->cpus_.size()) < workers) c->cpus_.clear();
  c->pids_.assign(workers, 0);
  c->started_.resize(workers);
  c->quick_failures_.assign(workers, 0);
  for (int w = 0; w < workers; ++w) {
    const pid_t pid = c->Spawn(w);
    if (pid < 0) return absl::InternalError("cannot start a worker process");
    c->pids_[w] = pid;
  }
  c->supervisor_ = std::thread([raw = c.get()] { raw->Supervise(); });
  c->WaitForWorkers(kRegisterWait);
  if (!c->log_dir_.empty()) {
    std::fprintf(stderr, "worker logs: %s/worker-{0..%d}.log\n", c->log_dir_.c_str(),
                 workers - 1);
    // The workers' metrics addresses (PORT 0: chosen by each worker), as they logged them, in
    // worker order.
    for (int w = 0; w < workers && !c->metrics_host_.empty(); ++w) {
      absl::StatusOr<std::string> log = ReadFileToString(c->LogPath(w), {.regular_only = true});
      const size_t at = log.ok() ? log->rfind("metrics on ") : std::string::npos;  // this run's
      if (at == std::string::npos) continue;
      std::fprintf(stderr, "%s\n", log->substr(at, log->find('\n', at) - at).c_str());
    }
  }
  return c;
}

void LocalCluster::WaitForWorkers(std::chrono::milliseconds at_most) {
  const auto until = std::chrono::steady_clock::now() + at_most;
  while (std::chrono::steady_clock::now() < until) {
    int64_t expected = 0;  // the slots not given up
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (pid_t p : pids_) expected += p != 0 ? 1 : 0;
    }
    if (expected == 0 || service_->registered_workers() >= expected) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

pid_t LocalCluster::Spawn(int slot) {
  const std::string name = absl::StrCat("local-", slot);
  std::vector<std::string> args = {exe_, "worker", "--coordinator", address_, "--name", name};
  if (!devices_.empty()) {
    args.push_back("--device");
    args.push_back(devices_[slot % devices_.size()]);
  }
  // The workers keep activations under the budget of the run that starts them (grad's or
  // train's --kept-mib; this process keeps none).
  args.push_back("--kept-mib");
  args.push_back(std::to_string(kept_budget_ >> 20));
  if (row_budget_ >= 0) {
    args.push_back("--device-mem-mib");
    args.push_back(std::to_string(row_budget_ >> 20));
  }
  if (service_options_worker_tree_) {  // the worker tree's endpoint, beside the socket
    args.push_back("--peer-listen");
    args.push_back(absl::StrCat("unix:", socket_dir_, "/peer-", slot));
  }
  if (!metrics_host_.empty()) {
    args.push_back("--metrics-listen");
    args.push_back(absl::StrCat(metrics_host_, ":", metrics_port_ > 0 ? metrics_port_ + slot : 0));
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  started_[slot] = std::chrono::steady_clock::now();
  const std::string log = LogPath(slot);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a worker never outlives its coordinator process
    if (getppid() != parent) _exit(1);  // which died before the line above took effect
    // A process group of its own: a terminal's Ctrl-C reaches the coordinator process only,
    // which finishes its step and saves before it stops its workers (cli/train_cmd.cc).
    setpgid(0, 0);
    if (!log.empty()) {  // best effort: the inherited stderr if the log cannot be opened
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
    }
    if (!cpus_.empty()) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus_[slot % cpus_.size()], &one);
      sched_setaffinity(0, sizeof(one), &one);  // best effort: unpinned if refused
    }
    execv(exe_.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Under mu_: slot w cannot start; the job goes on with the others, or ends with `why`.
void LocalCluster::GiveUp(size_t w, const std::string& why) {
  const std::string log = LogPath(static_cast<int>(w));
  if (!log.empty()) {
    std::fprintf(stderr, "worker %zu's last lines (%s):\n%s\n", w, log.c_str(),
                 Tail(log, 5).c_str());
  }
  pids_[w] = 0;
  const int64_t left = std::count_if(pids_.begin(), pids_.end(), [](pid_t p) { return p != 0; });
  if (left > 0) {
    std::fprintf(stderr, "%s; going on with %lld worker(s)\n", why.c_str(),
                 static_cast<long long>(left));
  } else {
    std::fprintf(stderr, "%s; no worker left\n", why.c_str());
    service_->Abort(absl::UnavailableError(why + "; no worker left"));
  }
}

// Under mu_: starts slot w again; a fork that fails counts as a quick failure, and is tried
// again kForkRetry later (Supervise).
void LocalCluster::Restart(size_t w) {
  pids_[w] = Spawn(static_cast<int>(w));
  if (pids_[w] > 0) {
    restarts_.fetch_add(1);
    return;
  }
  const std::string why = absl::StrCat("worker ", w, " cannot be started: fork: ",
                                       std::strerror(errno));
  if (++quick_failures_[w] >= kMaxQuickFailures) {
    GiveUp(w, absl::StrCat(why, ", ", kMaxQuickFailures, " times in a row"));
  } else {
    std::fprintf(stderr, "%s; trying again\n", why.c_str());
  }
}

// Runs until the destructor has stopped the workers: a worker this thread started dies with
// it (PR_SET_PDEATHSIG follows the forking thread), so it must outlive them.
void LocalCluster::Supervise() {
  while (!exit_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (stopping_.load()) continue;  // the destructor stops and reaps the workers
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t w = 0; w < pids_.size(); ++w) {
      if (pids_[w] < 0) {  // its fork failed: again once kForkRetry has passed
        if (std::chrono::steady_clock::now() - started_[w] >= kForkRetry) Restart(w);
        continue;
      }
      int status = 0;
      if (pids_[w] <= 0 || waitpid(pids_[w], &status, WNOHANG) != pids_[w]) continue;
      if (stopping_.load()) {  // reaped: the destructor must not signal its (reusable) pid
        pids_[w] = 0;
        break;
      }
      const std::string how =
          WIFSIGNALED(status) ? absl::StrCat("was killed by signal ", WTERMSIG(status))
                              : absl::StrCat("exited with status ", WEXITSTATUS(status));
      // Failed by itself: an error exit, or a crash. A kill from outside (SIGKILL, SIGTERM) or
      // a clean exit is not the worker's doing: it is started again, however often.
      const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      const bool failed = (WIFEXITED(status) && WEXITSTATUS(status) != 0) || sig == SIGSEGV ||
                          sig == SIGABRT || sig == SIGBUS || sig == SIGFPE || sig == SIGILL;
      const bool quick = std::chrono::steady_clock::now() - started_[w] < kQuickExit;
      quick_failures_[w] = failed && quick ? quick_failures_[w] + 1 : 0;
      if (quick_failures_[w] >= kMaxQuickFailures) {
        GiveUp(w, absl::StrCat("worker ", w, " cannot start: it ", how, " within ",
                               kQuickExit.count(), " s of its start ", kMaxQuickFailures,
                               " times in a row (its error is above)"));
        continue;
      }
      std::fprintf(stderr, "worker %zu (pid %d) %s; starting it again\n", w, pids_[w],
                   how.c_str());
      Restart(w);
    }
    // Workers connected, and none gets tasks (each skipped the job's tasks, or sent non-finite
    // results, too often): no other worker comes to a local cluster, so the run ends saying
    // why, where it waited without a word.
    const TaskServiceImpl::WorkerCounts counts = service_->worker_counts();
    if (!stopping_.load() && counts.connected > 0 && counts.live == 0) {
      service_->Abort(absl::UnavailableError(absl::StrCat(
          "no worker of this local cluster takes its tasks: ", service_->ShunNote())));
    }
  }
}

std::vector<pid_t> LocalCluster::worker_pids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pids_;
}

LocalCluster::~LocalCluster() {
  stopping_.store(true);  // no more restarts; the supervisor's thread lives on (Supervise)
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
  exit_.store(true);
  if (supervisor_.joinable()) supervisor_.join();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
  if (!socket_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(socket_dir_, ec);
  }
}

}  // namespace adjsh::coordinator
