// A coordinator TaskService and N worker processes on loopback: what `adjsh train --workers N`
// and `adjsh grad --workers N` run. Workers are `adjsh worker` processes started from this
// binary; one that dies while the cluster runs is started again (its leased task expires and is
// handed out anew), so the job goes on. One that fails by itself (exits non-zero, or crashes)
// within seconds of its start, or whose fork fails (tried again a second later), several times
// in a row, cannot start at all (a device it cannot use, a metrics port taken, no processes
// left): it is given up, and the job goes on with the others; with none left the cluster
// aborts its service with the reason, so the gradient waiting on workers returns that error
// instead of waiting for ever.
//
// With no more workers than the cores this process may use, worker i is pinned to the i-th of
// them (its threads inherit it).
//
// The cluster talks plaintext gRPC over a Unix socket in a private directory (mode 0700, under
// $TMPDIR or /tmp), never over TCP: only processes of the same user can connect, without the
// cost of TLS, and nothing is exposed to the network or to other local users.
#ifndef ADJSH_COORDINATOR_LOCAL_CLUSTER_H_
#define ADJSH_COORDINATOR_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/task_service.h"
#include "kernels/cpu/kept_pool.h"
#include "grpcpp/grpcpp.h"

namespace adjsh::coordinator {

struct LocalClusterOptions {
  TaskServiceOptions service;
  // "HOST:PORT": worker i serves its metrics on HOST:(PORT + i), or on a free port of HOST each
  // when PORT is 0 (each worker logs 'metrics on HOST:PORT'); "": none.
  std::string worker_metrics;
  // Worker i computes on worker_devices[i % size] ("cpu", "cuda:N"); empty: all on the CPU.
  std::vector<std::string> worker_devices;
  // Non-empty: worker i's output is appended to log_dir/worker-<i>.log (the directory is
  // created) instead of this process's stderr, which then carries only what the cluster says:
  // the log paths, each worker's "metrics on HOST:PORT" line once it registered, and the last
  // lines of the log of a worker that cannot start.
  std::string log_dir;
  // The workers' --kept-mib: the budget of the run that starts them (its Device::kept_budget).
  int64_t kept_budget = cpu::kDefaultKeptBudget;
  // The workers' --device-mem-mib when >= 0 (its Device::row_budget); < 0: their default.
  int64_t row_budget = -1;
};

class LocalCluster {
 public:
  // Serves on a Unix socket in a fresh private directory and starts `workers` worker processes
  // of `exe` connected to it.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(int workers, const std::string& exe,
                                                             LocalClusterOptions options = {});
  ~LocalCluster();  // stops the workers (SIGTERM, then SIGKILL after 5 s) and the server

  TaskServiceImpl& service() { return *service_; }
  const std::string& address() const { return address_; }  // "unix:/tmp/adjsh-.../coordinator"
  std::vector<pid_t> worker_pids() const;
  // Worker i's log file ("" without LocalClusterOptions::log_dir).
  std::string LogPath(int slot) const;
  int restarts() const { return restarts_.load(); }

 private:
  LocalCluster() = default;
  // A worker that fails by itself this many times in a row, each time within kQuickExit of its
  // start, cannot start: it is given up.
  static constexpr int kMaxQuickFailures = 3;
  static constexpr std::chrono::seconds kQuickExit{10};
  // Start waits this long at most for every worker to register.
  static constexpr std::chrono::seconds kRegisterWait{20};

  static constexpr std::chrono::seconds kForkRetry{1};  // after a failed fork

  pid_t Spawn(int slot);  // under mu_ (or before the supervisor runs); -1: fork failed
  void Restart(size_t slot);                          // under mu_
  void GiveUp(size_t slot, const std::string& why);  // under mu_
  // Until every worker not given up has registered, or `at_most`: the first step deals its
  // spans to the workers registered when it begins.
  void WaitForWorkers(std::chrono::milliseconds at_most);
  void Supervise();

  std::string exe_, address_;
  std::vector<std::string> devices_;
  std::vector<int> cpus_;  // worker i runs on cpus_[i % size] (empty: unpinned, more workers
                           // than cores)
  std::string metrics_host_;  // empty: workers serve no metrics
  int metrics_port_ = 0;
  std::string socket_dir_;  // the private directory of the sockets; removed with the cluster
  std::string log_dir_;     // LocalClusterOptions::log_dir
  bool service_options_worker_tree_ = true;  // workers serve peer endpoints (the worker tree)
  int64_t kept_budget_ = cpu::kDefaultKeptBudget;  // bytes, passed on as --kept-mib
  int64_t row_budget_ = -1;                         // bytes, passed on as --device-mem-mib
  std::unique_ptr<TaskServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  mutable std::mutex mu_;
  std::vector<pid_t> pids_;  // guarded by mu_; 0: a slot given up; -1: its fork failed (retried)
  std::vector<std::chrono::steady_clock::time_point> started_;  // guarded by mu_
  std::vector<int> quick_failures_;                             // guarded by mu_
  std::atomic<bool> stopping_{false};  // no more restarts: the destructor stops the workers
  std::atomic<bool> exit_{false};      // the supervisor's thread ends: the workers are gone
  std::atomic<int> restarts_{0};
  std::thread supervisor_;
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_LOCAL_CLUSTER_H_
