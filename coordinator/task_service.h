// The coordinator's TaskService: hands the (layer, span) tasks of the gradient being computed
// to the workers that own the spans, under leases (coordinator/span_scheduler.h), streams each
// task its small inputs, and applies each accepted result exactly once to the step's ledger
// (engine/span_ledger.h). The coordinator computes nothing per token: the workers keep their
// spans' rows, so the gradient is bitwise the in-process one (engine/span_step.h) for any
// number of workers, retries, lost workers and rebuilt spans.
#ifndef ADJSH_COORDINATOR_TASK_SERVICE_H_
#define ADJSH_COORDINATOR_TASK_SERVICE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/task_queue.h"
#include "coordinator/span_scheduler.h"
#include "engine/adjoint_engine.h"
#include "engine/segments.h"
#include "engine/step_profile.h"
#include "proto/adjsh.grpc.pb.h"

namespace adjsh::coordinator {

struct TaskServiceOptions {
  absl::Duration lease = absl::Seconds(5);  // renewed by heartbeats; unrenewed, re-handed out
  int64_t heartbeat_interval_ms = 500;
  int64_t retry_after_ms = 20;              // NoTask: ask again after this long
  // PullTask waits this long for a task to become ready for the caller before NoTask.
  absl::Duration long_poll = absl::Milliseconds(100);
  uint64_t max_result_bytes = uint64_t{1} << 32;
  int64_t max_workers = 10000;  // registered at once; RegisterWorker is refused past it
  // A worker unheard of this long (at least 4 leases) is forgotten; it re-registers if it lives.
  absl::Duration reap_after = absl::Minutes(2);
  // Non-empty: every finished step of one sequence appends one line per task here
  // (engine/step_profile.h TraceLine), for bench/fleet_sim.py, which replays one plan: a step
  // of several sequences (ComputeGradients) is not traced.
  std::string trace_path;
  // Reduce among the workers (the worker tree: proto/adjsh.proto WorkerTree) when every worker
  // the step starts with serves a peer endpoint; false: always through the coordinator (the
  // star). The bits are the same either way.
  bool worker_tree = true;
};

// Caps this process's malloc arenas. A coordinator's RPCs run on many gRPC threads at once (a
// long poll per idle worker), and each thread's own arena fragments: with 32 workers the RSS
// grew at every step; with 2 arenas it stays flat (tests/faults/test_load.py;
// docs/BENCHMARKS.md).
// The coordinator computes nothing per token, so fewer arenas cost nothing. Call once, before
// serving (adjsh coordinator, and a local cluster's process).
void LimitMallocArenasForServing();

class TaskServiceImpl final : public v1::TaskService::Service {
 public:
  explicit TaskServiceImpl(TaskServiceOptions options = {});

  // One gradient on the workers; blocks until every task's result is in. The exact gradient in
  // f32 by the span schedule (options.schedule kSpans, window 0, CPU options: the workers
  // choose their own device).
  absl::StatusOr<GradResult<float>> ComputeGradient(const ModelParams<float>& params,
                                                    std::span<const uint32_t> tokens,
                                                    const GradOptions& options,
                                                    const std::string& job_id, int64_t step);
  // The gradients of several sequences at once (a batch, or held-out sequences): one step
  // whose tasks are every sequence's (layer, span) tasks, so that the sequences are more spans
  // to spread over the workers; each result is bitwise that sequence's ComputeGradient. The
  // pieces (at least one, all of one kind: forward_only alike) and their tokens outlive the
  // call. With more than one sequence the step reduces through the coordinator (the worker
  // tree sums one sequence's partials).
  absl::StatusOr<std::vector<GradResult<float>>> ComputeGradients(
      const ModelParams<float>& params, std::span<const GradPiece> pieces,
      const std::string& job_id, int64_t step);
  // The same for a Mamba-2 model (engine/span_math.h): the same tasks, ledger, leases
  // and rebuilds, reduced as a Mamba-1 step (the worker tree or the star), on the workers'
  // devices (a device lacking a Mamba-2 layer skips the tasks, naming it).
  absl::StatusOr<Mamba2GradResult<float>> ComputeGradient(const Mamba2Params<float>& params,
                                                          std::span<const uint32_t> tokens,
                                                          const GradOptions& options,
                                                          const std::string& job_id,
                                                          int64_t step);
  absl::StatusOr<std::vector<Mamba2GradResult<float>>> ComputeGradients(
      const Mamba2Params<float>& params, std::span<const GradPiece> pieces,
      const std::string& job_id, int64_t step);

  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override;
  grpc::Status PullTask(grpc::ServerContext*, const v1::PullTaskRequest*,
                        v1::PullTaskResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override;
  grpc::Status FetchInputs(grpc::ServerContext*, const v1::FetchInputsRequest*,
                           grpc::ServerWriter<v1::TensorChunk>*) override;
  grpc::Status PushResult(grpc::ServerContext*, grpc::ServerReader<v1::ResultChunk>*,
                          v1::PushResultResponse*) override;
  grpc::Status FetchParams(grpc::ServerContext*, const v1::FetchParamsRequest*,
                           grpc::ServerWriter<v1::TensorChunk>*) override;
  grpc::Status PushReduced(grpc::ServerContext*, grpc::ServerReader<v1::SumChunk>*,
                           v1::PushResultResponse*) override;

  // Ends the gradient being computed: its ComputeGradient returns CANCELLED, and the workers
  // holding its tasks are told to drop them at their next heartbeat.
  void CancelCurrent();

  // Fails the service for good: the gradient being computed and every later ComputeGradient
  // return `why` (not OK). A local cluster whose workers cannot start calls it, so that a run
  // ends with the reason instead of waiting for workers that never come.
  void Abort(absl::Status why);

  int64_t results_accepted() const;
  // Results that came from a span its worker had to rebuild first (a new or returning owner).
  int64_t span_rebuilds() const;
  // Steps started again because a worker of their tree was lost (the tree's sums it held are
  // gone with it; docs/ARCHITECTURE.md "Faults").
  int64_t step_restarts() const;
  // Group roots accepted from worker trees.
  int64_t roots_accepted() const;
  int64_t results_rejected() const;
  // Tasks workers skipped (PullTaskRequest.skipped: their leases ended at once), and results
  // refused as malformed (their leases kept): each counts against its worker
  // (kShunAfterSkipped in a row, and it gets no more of the job's tasks).
  int64_t tasks_skipped() const;
  // Results refused for a non-finite value (NaN or Inf) in a partial, dL/du or mu: each was
  // handed out again; a worker that sent kShunAfterNonFinite of them gets no more tasks.
  int64_t results_nonfinite() const;
  int64_t registered_workers() const;  // dead ones are reaped (TaskServiceOptions::reap_after)
  static constexpr size_t kMaxWorkerNameBytes = 256;
  static constexpr int kShunAfterNonFinite = 3;
  static constexpr int kShunAfterSkipped = 3;
  static constexpr int kMaxSkippedPerPull = 16;  // PullTaskRequest.skipped past these: ignored
  // With a worker tree: roots still missing this long after the step's last task (and every
  // worker live) begin the step again through the coordinator. kRootsDeadlineLeases leases,
  // plus the time the sums take to climb the tree at kSlowTreeBytesPerSecond: each sum is the
  // model's size in f32, sent once per level (ceil(log2 workers) + 1 levels), so that a large
  // model on a slow link is not taken for a tree that cannot get its sums through.
  static constexpr int kRootsDeadlineLeases = 4;
  static constexpr double kSlowTreeBytesPerSecond = 100e6;  // below a 1 Gb/s link's rate
  static absl::Duration RootsDeadline(absl::Duration lease, uint64_t param_bytes,
                                      size_t tree_workers);
  // Tensor bytes streamed to workers (FetchInputs) and received from them (PushResult).
  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;
  // For the metrics: the task counts of the gradient being computed (waiting, ready, leased,
  // done, total: zero when none) with the lease counters summed over every gradient so far.
  QueueStats queue_stats() const;
  // Both counts at one instant: connected, the workers heard from (register, pull, heartbeat)
  // within the last lease duration, and live, those of them that get tasks (not shunned for
  // non-finite results or skipped tasks), live <= connected.
  struct WorkerCounts {
    int64_t connected = 0, live = 0;
  };
  WorkerCounts worker_counts() const;
  // Parameter snapshots made (ParamTensors): one per step whose parameters a worker fetched.
  int64_t param_snapshots() const;
  // Why a connected worker gets no tasks (the first such one's: its skipped tasks' last reason,
  // or its non-finite results), "" when every connected one gets them.
  std::string ShunNote() const;
  absl::Duration lease() const { return opt_.lease; }

 private:
  // The gradient being computed: published while its span tasks are out.
  struct Step {
    std::vector<GradPiece> pieces;  // its sequences, with their own copies of the options
    // One per sequence; sequence b's task t is the step's task first[b] + t (first has B + 1
    // entries: the last is the step's task count).
    std::vector<std::unique_ptr<SpanScheduler>> seqs;
    std::vector<int64_t> first;
    // The parameters, of the step's model type (engine/families/family.h).
    EachFamily<ParamsOf> params;
    // The parameters as tensors, made by the first fetch that streams them and shared by every
    // later one of the step (ParamTensors): one copy of the model, not one per fetch.
    std::shared_ptr<const TensorMap> param_tensors;
    std::string job_id, config_json;
    // The worker tree of this version (empty peer list: the star), and its workers' ids in
    // tree order.
    v1::WorkerTree tree;
    std::vector<std::string> tree_workers;
    int64_t step = 0, version = 0;
    uint64_t wire_at_start = 0;  // bytes_sent + bytes_received when the step began
    int64_t restarts = 0;        // begun again after losing a tree worker
    absl::Time tasks_done_at = absl::InfiniteFuture();  // with a tree: every task done, roots
                                                         // still missing
    bool star_only = false;  // begun again because roots did not come: no tree this time
    // task -> (its current queue lease, the secret the wire lease id carries with it)
    std::map<int64_t, std::pair<int64_t, std::string>> lease_secrets;
    std::map<int64_t, absl::Time> leased_at;  // task -> when its current lease was granted
    std::map<int64_t, uint64_t> fetched;      // task -> bytes fetched under its current lease

    int64_t num_tasks() const { return first.back(); }
    // The sequence of the step's task `id` (0 <= id < num_tasks()), and its id there.
    int64_t SequenceOf(int64_t id) const;
    SpanScheduler& Locate(int64_t id, int64_t* local) const;
    bool Done() const;  // every sequence's tasks done (and roots in)
    QueueStats Stats() const;  // summed over the sequences
  };
  // The schedulers of the step's pieces, and their task offsets (Step::seqs, Step::first).
  struct Sequences {
    std::vector<std::unique_ptr<SpanScheduler>> seqs;
    std::vector<int64_t> first;
  };
  template <typename Params>
  static absl::StatusOr<Sequences> MakeSchedulers(const Params& params,
                                                  std::span<const GradPiece> pieces);
  // ComputeGradients for either model type (P: ModelParams, Mamba2Params).
  template <template <typename> class P>
  absl::StatusOr<std::vector<GradResult<float, P>>> RunStep(const P<float>& params,
                                                            std::span<const GradPiece> pieces,
                                                            const std::string& job_id,
                                                            int64_t step);
  struct Worker {
    std::string name;
    std::map<int64_t, int64_t> leases;  // task -> lease id, for heartbeats
    uint64_t resident_bytes = 0, peak_resident_bytes = 0;
    absl::Time last_seen;
    int64_t nonfinite_results = 0;
    // Tasks of the running job it skipped in a row (PullTaskRequest.skipped) or sent malformed
    // results of; reset by an accepted result and by a new job. kShunAfterSkipped of them: no
    // more tasks of the job, so that its spans go to the others instead of back to it for ever.
    int64_t skipped_tasks = 0;
    std::string last_skip;  // why the last one was skipped
    std::string identity;  // the client certificate's names at registration ("" without TLS)
    std::string peer_address;  // its PeerService ("" for none)
  };
  // Begins the current step's tasks (a new version) with the live workers: the workers' leases
  // of earlier versions forgotten, owners, and the worker tree when it can have one. Requires
  // mu_.
  void BeginStep();
  // With a worker tree: a worker of it is no longer live, so the sums it held are lost; the
  // step begins again as a new version (the same bits: every step starts from its tokens).
  // Also when every task is done but roots are missing RootsDeadline later:
  // then it begins again without a tree. Never once the step is done. Requires mu_.
  void RestartIfTreeLost();
  void ReapWorkers();  // forgets workers unheard of for reap_after. Requires mu_.
  // The skipped task's lease ends now, and it counts against the worker (Worker::skipped_tasks);
  // a stale or unknown lease is ignored. Requires mu_.
  void EndSkipped(const grpc::ServerContext* ctx, const std::string& worker_id,
                  const v1::SkippedTask& skipped);
  void CountSkip(Worker& w, std::string why);  // Requires mu_.
  // A result of the worker's refused as malformed or oversized (its lease kept): a skip, with
  // `why`. Requires mu_.
  void CountRefusedResult(const std::string& worker_id, const std::string& task_id,
                          absl::string_view why);
  // The current step's parameters as tensors, made once (Step::param_tensors). Requires mu_
  // and a current step.
  std::shared_ptr<const TensorMap> ParamTensors();
  // Heard from since `since` (a lease ago) and not shunned for non-finite results or skipped
  // tasks.
  static bool Live(const Worker& w, absl::Time since);
  // The ids of the live workers. Requires mu_.
  std::vector<std::string> LiveWorkers() const;
  void WriteTrace(const Step& step);  // appends the step's tasks to opt_.trace_path
  // Leases the next task for worker into resp; false when none is ready for it. Requires mu_.
  bool TryLease(const std::string& worker_id, Worker& worker, v1::PullTaskResponse* resp);
  // PERMISSION_DENIED unless the call comes with the identity w registered with.
  absl::Status CheckCaller(const Worker& w, const std::string& worker_id,
                           const grpc::ServerContext* ctx) const;
  // NOT_FOUND ("...: register") for an unknown worker, else CheckCaller. Requires mu_.
  absl::Status CheckRegistered(const grpc::ServerContext* ctx, const std::string& worker_id) const;
  // Streams tensors (counted in bytes_sent_ and *sent); UNAVAILABLE when the worker closed it.
  absl::Status StreamOut(const TensorMap& tensors, grpc::ServerWriter<v1::TensorChunk>* writer,
                         uint64_t* sent);
  // "version:task" <-> (version, task index).
  static std::string TaskName(int64_t version, int64_t task);
  absl::Status ParseTaskName(const std::string& name, int64_t* version, int64_t* task) const;
  // Adds the lease counters of the current step to past_ before it goes. Requires mu_.
  void RetireStep();
  // The current step's task, checking that lease_id is its live lease. Requires mu_.
  absl::Status CheckLease(const grpc::ServerContext* ctx, const std::string& worker_id,
                          const std::string& task_name, const std::string& lease_id,
                          int64_t* task, int64_t* lease) const;

  const TaskServiceOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  std::condition_variable work_cv_;  // a task may have become ready (PullTask's long poll)
  std::unique_ptr<Step> current_;        // guarded by mu_
  std::map<std::string, Worker> workers_;  // guarded by mu_
  // Worker ids carry a random per-process prefix: a worker that outlives a restarted
  // coordinator is unknown to the new one (NOT_FOUND: it registers again and drops its task),
  // so a stale task can never match a lease of the new process.
  static std::string Unguessable();  // 32 hex digits of fresh randomness
  int64_t next_version_ = 0, accepted_ = 0, rejected_ = 0;  // guarded by mu_
  int64_t nonfinite_ = 0;                                                       // guarded by mu_
  bool running_ = false, cancelled_ = false;                                  // guarded by mu_
  absl::Status aborted_;                                                      // guarded by mu_
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0};
  QueueStats past_;  // lease counters of the finished steps; guarded by mu_
  SpanOwners owners_;  // who owns which span, across steps; guarded by mu_
  // The workers (sorted ids) of a tree whose roots did not come: steps with the same ones use
  // the star. Guarded by mu_.
  std::vector<std::string> broken_tree_;
  std::string skips_job_;  // the job whose skipped tasks the workers count; guarded by mu_
  int64_t rebuilds_ = 0, restarts_ = 0, roots_ = 0, skipped_ = 0;  // guarded by mu_
  int64_t param_snapshots_ = 0;                                       // guarded by mu_
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_TASK_SERVICE_H_
