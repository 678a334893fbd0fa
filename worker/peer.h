// A worker's part in the worker tree of a step (proto/adjsh.proto WorkerTree,
// docs/ARCHITECTURE.md "The worker tree"):
//   - its PeerService (adjsh worker --peer-listen): FetchParams relays the step's parameters to
//     its tree children piece by piece as they arrive here; PushSum takes a node of a reduction
//     tree whose parent this worker sums;
//   - the nodes it sums (engine/tree_reduce.h), sent on by a sender thread: PushSum to the peer
//     that sums the parent, PushReduced to the coordinator for a root; each retried with backoff
//     while the step is still this worker's current one.
// A worker keeps the tree state of one step (the newest (job, version) it took a task of); a
// newer one drops it. What a lost worker held is not recovered here: the coordinator starts the
// step again (coordinator/task_service.h).
//
// Threads: the main thread (Enter, FetchParams, AddLeaves), gRPC's server threads (the two
// handlers) and the sender; one mutex.
#ifndef ADJSH_WORKER_PEER_H_
#define ADJSH_WORKER_PEER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "engine/reduce_groups.h"
#include "engine/tree_reduce.h"
#include "grpcpp/grpcpp.h"
#include "proto/adjsh.grpc.pb.h"
#include "proto/health.h"
#include "proto/tensor_codec.h"
#include "worker/shared_state.h"
#include "worker/task_io.h"
#include "worker/worker.h"

namespace adjsh::worker {

class PeerHub {
 public:
  // How long a peer's FetchParams waits for this worker to reach the step asked for.
  static constexpr std::chrono::seconds kRelayWait{10};

  PeerHub(const WorkerOptions& opt, v1::TaskService::Stub& coordinator, SharedState& state);
  ~PeerHub();
  PeerHub(const PeerHub&) = delete;
  PeerHub& operator=(const PeerHub&) = delete;

  // Serves the PeerService on opt.peer_listen (when set) and starts the sender. Returns the
  // address to advertise: opt.peer_advertise, else the listen address with the port bound;
  // "" without a listen address.
  absl::StatusOr<std::string> Start();
  void Shutdown();  // the server, the sender, every wait and the step's nodes; idempotent
  // The gRPC health service on the peer endpoint (proto/health.h), NOT_SERVING until the worker
  // says; null without an endpoint.
  HealthService* health() { return server_ ? &health_ : nullptr; }

  // The step of `task`, which has a tree: the first task of a newer (job, version) drops what
  // the older one held.
  // layout: the wire form of the step's groups (engine/reduce_groups.h), of either model type.
  // device_rows: a resident GPU worker's row space, where its leaves may stay (else null).
  void Enter(const v1::Task& task, std::shared_ptr<const GroupLayout> layout,
             RowSpace<float>* device_rows);
  // The parameters of the task's version, from the worker before it in the tree's order
  // (worker 0: the coordinator), relayed to the next as they arrive; from the coordinator when
  // that worker fails.
  std::optional<NoResult> FetchParams(const TaskState& held, const v1::Task& task,
                                      const AssemblerLimits& limits, TensorMap& got);
  // The partials of a task of an owned span: leaves of its trees, on the host or the device.
  absl::Status AddLeaves(const v1::Task& task, std::vector<GroupLeaf<float>> leaves);

  grpc::Status ServeParams(grpc::ServerContext* ctx, const v1::FetchParamsRequest* req,
                           grpc::ServerWriter<v1::TensorChunk>* writer);
  grpc::Status ReceiveSum(grpc::ServerContext* ctx, grpc::ServerReader<v1::SumChunk>* reader,
                          v1::PushSumResponse* resp);

  struct Stats {
    int64_t sums_sent = 0, roots_sent = 0, sums_received = 0;
    int64_t params_from_peer = 0, params_from_coordinator = 0, params_relayed = 0;
  };
  Stats stats() const;

 private:
  // The parameters' pieces as they arrive, for the next worker's FetchParams (kept only when
  // there is one, and freed once it has them all).
  struct Relay {
    bool keep = false;
    std::vector<v1::TensorChunk> chunks;
    bool done = false, failed = false, released = false;
    int readers = 0;  // FetchParams streams reading it now
  };
  struct Step {
    std::string job_id;
    uint64_t version = 0;
    std::shared_ptr<const GroupLayout> layout;
    v1::WorkerTree tree;
    std::unique_ptr<TreeReduce<float>> reduce;
    std::shared_ptr<Relay> relay;
  };
  struct Outgoing {
    std::string job_id;
    uint64_t version;
    std::shared_ptr<const GroupLayout> layout;
    std::string address;  // the peer's; "" for the coordinator
    TreeReduce<float>::Send send;
  };

  bool Current(const std::string& job, uint64_t version) const;  // requires mu_
  void Queue(std::vector<TreeReduce<float>::Send>& sends);       // requires mu_
  void SendLoop();
  absl::Status Push(const Outgoing& o, bool* accepted);
  // One FetchParams stream (a peer's or the coordinator's) into the relay and `got`.
  absl::Status StreamParams(grpc::ClientReader<v1::TensorChunk>& reader, grpc::ClientContext& ctx,
                            const std::shared_ptr<Relay>& relay, const AssemblerLimits& limits,
                            TensorMap& got);
  v1::PeerService::Stub& PeerStub(const std::string& address);  // requires mu_

  const WorkerOptions& opt_;
  v1::TaskService::Stub& coordinator_;
  SharedState& state_;
  std::unique_ptr<v1::PeerService::Service> service_;
  HealthService health_;
  std::unique_ptr<grpc::Server> server_;
  std::thread sender_;

  mutable std::mutex mu_;       // everything below
  // A step entered, relay pieces, sends queued, shutdown, the call in flight ended.
  std::condition_variable cv_;
  bool shutdown_ = false;
  Step step_;
  std::deque<Outgoing> outgoing_;
  // The sender's call in flight: Shutdown gives it kDrain to end, then cancels it.
  grpc::ClientContext* pushing_ = nullptr;
  std::map<std::string, std::unique_ptr<v1::PeerService::Stub>> peers_;
  Stats stats_;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_PEER_H_
