// adjsh worker: owns spans of a step (engine/span_plan.h), pulls their (layer, span) tasks from
// a coordinator's TaskService (proto/adjsh.proto), fetches their small inputs as streamed
// tensors, runs them on the rows it keeps (engine/span_work.h) and pushes the outputs back as
// streamed tensors.
//
//   Worker w(WorkerOptions{.coordinator = "127.0.0.1:50051"});
//   std::atomic<bool> stop{false};      // set it (e.g. from a signal handler) to end Run
//   absl::Status s = w.Run(stop);
//
// The protocol, as this worker speaks it:
//   RegisterWorker{name, "cpu", physical memory} -> worker_id, heartbeat_interval_ms; again after
//     NOT_FOUND from PullTask or Heartbeat (a coordinator restart); a task held then is dropped.
//   A heartbeat thread sends Heartbeat{worker_id, [held task], RSS, peak RSS} every interval;
//     a held task named in cancelled_task_ids is dropped (its in-flight fetch is cancelled; a
//     result already being pushed gets its own answer, accepted or not).
//   PullTask -> NoTask: wait retry_after_ms; Task: a SPAN_* kind in dtype F32 whose plan
//     (context, chunk, spans) fits its config (span_store.h CheckTask). Any other task is
//     logged and skipped without a result (its lease expires).
//   FetchInputs{include_params = this worker holds no model of the task's params_version,
//     include_span = it holds the span not at all, or not ready for the task}: the task's
//     inputs, the model, the span's tokens and replay, named and shaped as engine/span_tensors.h
//     says; every tensor is checked and a mismatch logged and the task skipped.
//     FAILED_PRECONDITION / NOT_FOUND: drop.
//   PushResult: ResultHeader, then the task's outputs (engine/span_tensors.h) in f32, in 1 MiB
//     pieces. accepted = false is normal (late or duplicate result).
// The model and the spans are kept per job for the newest params_version only (a newer version
// drops them); at most kMaxCachedJobs jobs are kept (least recently used dropped).
// Errors: UNAVAILABLE and DEADLINE_EXCEEDED are retried with exponential backoff (100 ms doubling
// to 2 s) forever for RegisterWorker and PullTask, and for FetchInputs / PushResult as long as
// the task's lease can still be alive (lease_expires_ms after the last heartbeat that renewed
// it). Every RPC has a deadline.
// Stop: Run notices the flag within 100 ms (SharedState::kStopPoll); it cancels pulls, fetches
// and backoff waits at once, drops a task whose compute has not begun, lets a running compute
// finish and pushes its result within stop_grace, then stops the heartbeat and returns OK.
//
// Inside: worker.cc registers, runs the heartbeat thread and the main loop; shared_state.h is
// what the threads share (the task held, the calls in flight, stop and shutdown); task_runner.h
// serves one task, with span_store.h (the per-job model and spans, the checks against the
// config) and task_io.h (the fetch and push streams); retry.h is the retry policy.
#ifndef ADJSH_WORKER_WORKER_H_
#define ADJSH_WORKER_WORKER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "proto/adjsh.grpc.pb.h"

namespace adjsh {
class HealthServer;
class HealthService;
}

namespace adjsh::worker {

class SharedState;
class WorkerMetrics;

struct WorkerOptions {
  std::string coordinator;  // HOST:PORT of the coordinator's TaskService
  // The channel's credentials (proto/credentials.h): TLS with the worker's client certificate,
  // or plaintext; null: plaintext. tls: they are TLS (for the log's hints on failed
  // connections, worker/retry.h ConnectHint).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  bool tls = false;
  // With TLS: the name the coordinator's certificate carries, checked instead of the host of
  // `coordinator` (--tls-server-name); "": the host.
  std::string coordinator_tls_name;
  std::string name;         // RegisterWorker.worker_name; empty = the host name
  uint64_t memory_bytes = 0;  // RegisterWorker.memory_bytes; 0 = physical memory
  int64_t log_every = 100;    // progress line every this many finished tasks; 0 = never
  int log_level = 1;          // 0 warnings and errors, 1 + info (registration, progress), 2 + debug
  std::chrono::milliseconds rpc_deadline{30000};      // unary RPCs
  std::chrono::milliseconds stream_deadline{600000};  // FetchInputs / PushResult streams
  std::chrono::milliseconds backoff_min{100}, backoff_max{2000};
  std::chrono::milliseconds stop_grace{5000};  // for pushing a finished result after stop
  WorkerMetrics* metrics = nullptr;  // optional (worker/metrics.h); must outlive the Worker
  Device device;  // where tasks are computed (kernels/backend.h)
  std::string spill_dir;  // non-empty: spans' layer inputs in memory-mapped files here
  // The worker tree (worker/peer.h): serve a PeerService here ("HOST:PORT", port 0 for a free
  // one, or "unix:PATH"); "": none (the steps this worker is in reduce through the
  // coordinator). peer_advertise: the address peers reach it at ("": the listen address).
  std::string peer_listen, peer_advertise;
  // TLS for the peer endpoint (the worker's certificate as the server's, peers' client
  // certificates verified); null: plaintext (loopback and Unix sockets only). Peers are
  // reached with `credentials`.
  std::shared_ptr<grpc::ServerCredentials> peer_credentials;
  // With TLS: the name peers' certificates carry, checked instead of the host of their address
  // (pods reached by IP share one certificate name); "": the address's host.
  std::string peer_tls_name;
  // Non-null: set SERVING once registered, NOT_SERVING when the worker stops (proto/health.h);
  // must outlive the Worker.
  HealthServer* health = nullptr;
};

// Counters, readable at any time (for tests and logs).
struct WorkerStats {
  int64_t registrations = 0;    // successful RegisterWorker calls
  int64_t tasks_pulled = 0;     // tasks received from PullTask
  int64_t tasks_done = 0;       // results pushed (accepted or not)
  int64_t results_rejected = 0;  // of those, answered accepted = false
  int64_t tasks_dropped = 0;    // lease lost, cancelled, invalid or unsupported: no result
  int64_t params_fetched = 0;   // FetchInputs calls with include_params = true
};

class PeerHub;

class Worker {
 public:
  static constexpr int kMaxCachedJobs = 4;

  explicit Worker(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves tasks until `stop` becomes true, then returns OK. Returns an error only for a
  // coordinator that refuses this worker for good (INVALID_ARGUMENT, UNIMPLEMENTED,
  // PERMISSION_DENIED, UNAUTHENTICATED from RegisterWorker or PullTask). Call once.
  absl::Status Run(std::atomic<bool>& stop);

  WorkerStats stats() const;

 private:
  absl::Status Register();                               // until success, stop, or a fatal error
  absl::Status Reregister(const std::string& stale_id);  // once per stale id, from either thread
  void HeartbeatLoop();

  const WorkerOptions opt_;
  std::string peer_address_;  // advertised in RegisterWorker ("" for none)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TaskService::Stub> stub_;
  std::unique_ptr<SharedState> state_;  // what the main, heartbeat and stop-watch threads share
  std::mutex register_mu_;              // one registration at a time
  // The health service on the peer endpoint (worker/peer.h), set as opt_.health is; null
  // without one.
  HealthService* main_health_ = nullptr;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_WORKER_H_
