#include "worker/peer.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/status_util.h"
#include "proto/transport.h"
#include "worker/retry.h"

namespace adjsh::worker {
namespace {

using std::chrono::milliseconds;

grpc::Status Error(const absl::Status& s) { return ToGrpcStatus(s); }

// Receives what the hub serves.
class PeerServiceImpl final : public v1::PeerService::Service {
 public:
  explicit PeerServiceImpl(PeerHub& hub) : hub_(hub) {}
  grpc::Status FetchParams(grpc::ServerContext* ctx, const v1::FetchParamsRequest* req,
                           grpc::ServerWriter<v1::TensorChunk>* writer) override {
    return hub_.ServeParams(ctx, req, writer);
  }
  grpc::Status PushSum(grpc::ServerContext* ctx, grpc::ServerReader<v1::SumChunk>* reader,
                       v1::PushSumResponse* resp) override {
    return hub_.ReceiveSum(ctx, reader, resp);
  }

 private:
  PeerHub& hub_;
};

// Where worker i > 0 gets the parameters: worker i - 1, a chain. Each relays the pieces as they
// arrive, so every link carries the parameters once and the last worker has them one copy's
// time plus a piece per hop after the first (a binomial tree would have its root send log2 W
// whole copies, one after another).
int32_t ParentOf(int32_t i) { return i - 1; }

}  // namespace

PeerHub::PeerHub(const WorkerOptions& opt, v1::TaskService::Stub& coordinator, SharedState& state)
    : opt_(opt), coordinator_(coordinator), state_(state) {}

PeerHub::~PeerHub() { Shutdown(); }

absl::StatusOr<std::string> PeerHub::Start() {
  std::string address;
  if (!opt_.peer_listen.empty()) {
    service_ = std::make_unique<PeerServiceImpl>(*this);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(
        opt_.peer_listen,
        opt_.peer_credentials ? opt_.peer_credentials : grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    builder.RegisterService(&health_);
    ConfigureServer(builder, kDefaultMaxMessageBytes);  // keepalive as the clients', limits
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || (port == 0 && !absl::StartsWith(opt_.peer_listen, "unix:"))) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve the peer endpoint on ", opt_.peer_listen));
    }
    address = opt_.peer_advertise;
    if (address.empty() && absl::StartsWith(opt_.peer_listen, "unix:")) address = opt_.peer_listen;
    if (address.empty()) {
      const size_t colon = opt_.peer_listen.rfind(':');
      address = absl::StrCat(opt_.peer_listen.substr(0, colon), ":", port);
    }
    state_.Log(1, absl::StrCat("peer endpoint on ", address));
  }
  sender_ = std::thread([this] { SendLoop(); });
  return address;
}

// A call in flight at shutdown is most often one the receiver has already taken: the step's
// last root, whose arrival ends the step and so, through the coordinator, this worker. It gets
// kDrain to end before it is cancelled. Cancelled at once, its answer could be lost after the
// coordinator had taken it, and the root went uncounted in this worker's tree line: the likely
// cause of one failure of tests/bench/test_fleet_sim.py LiveTraceTest, which compares those
// lines with the simulated tree, in a CI run on a loaded machine (4 roots where 5 were sent).
void PeerHub::Shutdown() {
  constexpr auto kDrain = milliseconds(1000);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, kDrain, [&] { return pushing_ == nullptr; });
    if (pushing_ != nullptr) pushing_->TryCancel();
  }
  cv_.notify_all();
  health_.SetServing(false);
  health_.Stop();  // its Watch calls end before the server's shutdown waits for them
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
  if (sender_.joinable()) sender_.join();
  // The step's nodes go now: device ones are buffers of the task runner's backend, which the
  // worker destroys before this hub (worker/worker.cc).
  std::lock_guard<std::mutex> lock(mu_);
  step_ = Step();
  outgoing_.clear();
}

PeerHub::Stats PeerHub::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool PeerHub::Current(const std::string& job, uint64_t version) const {
  return step_.reduce != nullptr && step_.job_id == job && step_.version == version;
}

void PeerHub::Enter(const v1::Task& task, std::shared_ptr<const GroupLayout> layout,
                    RowSpace<float>* device_rows) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Current(task.job_id(), task.params_version())) return;
  if (step_.job_id == task.job_id() && step_.version > task.params_version()) return;  // stale
  const v1::WorkerTree& tree = task.tree();
  std::vector<int32_t> owner(tree.span_owner().begin(), tree.span_owner().end());
  Step fresh;
  fresh.job_id = task.job_id();
  fresh.version = task.params_version();
  fresh.reduce = std::make_unique<TreeReduce<float>>(task.spans(), std::move(owner), tree.self(),
                                                     layout->K);
  if (device_rows != nullptr) {  // a resident GPU worker's leaves may stay on its device
    std::vector<std::vector<size_t>> sizes;
    for (const std::vector<GroupSlot>& group : layout->groups) {
      sizes.emplace_back();
      for (const GroupSlot& slot : group) sizes.back().push_back(ShapeNumel(slot.shape));
    }
    fresh.reduce->SetDevice(device_rows, std::move(sizes));
  }
  if (layout->tied) fresh.reduce->TieEmbedRoots();  // head + lookup cross as one
  fresh.layout = std::move(layout);
  fresh.tree = tree;
  fresh.relay = std::make_shared<Relay>();
  fresh.relay->keep = tree.self() + 1 < tree.peer_size();
  if (step_.relay) step_.relay->failed = true;  // a child still reading it asks elsewhere
  step_ = std::move(fresh);
  std::erase_if(outgoing_, [&](const Outgoing& o) { return !Current(o.job_id, o.version); });
  cv_.notify_all();
}

absl::Status PeerHub::AddLeaves(const v1::Task& task, std::vector<GroupLeaf<float>> leaves) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!Current(task.job_id(), task.params_version())) return absl::OkStatus();  // a left step
  std::vector<TreeReduce<float>::Send> out;
  absl::Status status;
  for (GroupLeaf<float>& leaf : leaves) {
    status = step_.reduce->PutLeaf(leaf.group, task.span(), std::move(leaf.value),
                                   std::move(leaf.device), out);
    if (!status.ok()) break;
  }
  Queue(out);  // what the leaves before a refused one made
  return status;
}

void PeerHub::Queue(std::vector<TreeReduce<float>::Send>& sends) {
  for (TreeReduce<float>::Send& send : sends) {
    std::string address =
        send.to == TreeReduce<float>::kCoordinator ? "" : step_.tree.peer(send.to);
    outgoing_.push_back({step_.job_id, step_.version, step_.layout,
                         std::move(address), std::move(send)});
  }
  if (!sends.empty()) cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// Parameters down the tree

absl::Status PeerHub::StreamParams(grpc::ClientReader<v1::TensorChunk>& reader,
                                   grpc::ClientContext& ctx, const std::shared_ptr<Relay>& relay,
                                   const AssemblerLimits& limits, TensorMap& got) {
  got.clear();
  TensorAssembler assembler(limits);
  v1::TensorChunk chunk;
  absl::Status bad;
  while (reader.Read(&chunk)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (relay->keep) relay->chunks.push_back(chunk);
    }
    cv_.notify_all();
    absl::StatusOr<std::optional<NamedTensor>> done = assembler.Add(chunk);
    if (!done.ok()) {
      bad = done.status();
      ctx.TryCancel();
      break;
    }
    if (done->has_value()) got[(*done)->name] = std::move((*done)->tensor);
  }
  absl::Status s = FromGrpcStatus(reader.Finish());
  if (!bad.ok()) return bad;
  if (s.ok()) s = assembler.Finish();
  return s;
}

std::optional<NoResult> PeerHub::FetchParams(const TaskState& held, const v1::Task& task,
                                             const AssemblerLimits& limits, TensorMap& got) {
  std::shared_ptr<Relay> relay;
  int32_t self = 0;
  std::string parent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Current(task.job_id(), task.params_version())) return NoResult{false, "a later step"};
    if (step_.relay->done || step_.relay->released || !step_.relay->chunks.empty()) {
      // Fetched once already (the model was dropped since): a relay of its own, never appended
      // to one that readers took as whole.
      const bool keep = step_.relay->keep;
      step_.relay->failed = !step_.relay->done;
      step_.relay = std::make_shared<Relay>();
      step_.relay->keep = keep;
      cv_.notify_all();
    }
    relay = step_.relay;
    self = step_.tree.self();
    if (self > 0) parent = step_.tree.peer(ParentOf(self));
  }
  v1::FetchParamsRequest request;
  request.set_job_id(task.job_id());
  request.set_params_version(task.params_version());
  auto finish = [&](absl::Status s, bool from_peer) -> std::optional<NoResult> {
    std::lock_guard<std::mutex> lock(mu_);
    if (s.ok()) {
      relay->done = true;
      ++(from_peer ? stats_.params_from_peer : stats_.params_from_coordinator);
    } else {
      relay->failed = true;  // a child reading it falls back to the coordinator
      if (Current(task.job_id(), task.params_version())) {
        const bool keep = relay->keep;
        relay = step_.relay = std::make_shared<Relay>();
        relay->keep = keep;
      }
    }
    cv_.notify_all();
    return std::nullopt;
  };
  if (!parent.empty()) {
    absl::Status s;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx, opt_.stream_deadline);
      SharedState::CallScope scope(state_, ctx, CallKind::kStoppable, held.task_id);
      v1::PeerService::Stub* stub;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stub = &PeerStub(parent);
      }
      std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader =
          stub->FetchParams(&ctx, request);
      s = StreamParams(*reader, ctx, relay, limits, got);
    }
    if (s.ok()) return finish(s, true);
    finish(s, true);
    state_.Log(1, absl::StrCat("parameters from the tree parent ", parent, " failed (",
                               s.ToString(), "): from the coordinator"));
  }
  request.set_worker_id(held.worker_id);
  Backoff backoff(opt_.backoff_min, opt_.backoff_max);
  std::string why;
  for (;;) {
    if (!state_.TaskAlive(held, &why)) return NoResult{false, why};
    if (state_.Stopping()) return NoResult{false, "stopping"};
    absl::Status s;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx, opt_.stream_deadline);
      SharedState::CallScope scope(state_, ctx, CallKind::kStoppable, held.task_id);
      std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader =
          coordinator_.FetchParams(&ctx, request);
      s = StreamParams(*reader, ctx, relay, limits, got);
    }
    finish(s, false);
    if (s.ok()) return std::nullopt;
    if (absl::IsInvalidArgument(s) || absl::IsResourceExhausted(s)) {
      return NoResult{true, absl::StrCat("malformed parameters: ", s.ToString())};
    }
    if (!IsTransient(s.code())) return NoResult{false, absl::StrCat("FetchParams: ", s.ToString())};
    if (!state_.SleepFor(backoff.Next())) return NoResult{false, "stopping"};
  }
}

grpc::Status PeerHub::ServeParams(grpc::ServerContext* ctx, const v1::FetchParamsRequest* req,
                                  grpc::ServerWriter<v1::TensorChunk>* writer) {
  std::shared_ptr<Relay> relay;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const bool reached = cv_.wait_for(lock, kRelayWait, [&] {
      return shutdown_ || (step_.job_id == req->job_id() && step_.version >= req->params_version());
    });
    if (!reached || !Current(req->job_id(), req->params_version())) {
      return Error(absl::UnavailableError(absl::StrCat("this worker is not in step version ",
                                                       req->params_version(), " of that job")));
    }
    relay = step_.relay;
    if (!relay->keep || relay->released) {
      return Error(absl::UnavailableError("this worker keeps no copy of the parameters to relay"));
    }
    ++relay->readers;
  }
  struct Reading {  // the relay's count of readers, however the stream ends
    std::mutex& mu;
    Relay& relay;
    ~Reading() {
      std::lock_guard<std::mutex> lock(mu);
      --relay.readers;
    }
  } reading{mu_, *relay};
  for (size_t i = 0;;) {
    v1::TensorChunk chunk;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, milliseconds(100), [&] {
        return shutdown_ || relay->failed || relay->done || i < relay->chunks.size();
      });
      if (i < relay->chunks.size()) {
        chunk = relay->chunks[i++];
      } else if (relay->done) {
        ++stats_.params_relayed;
        if (relay->readers == 1) {  // the next worker has them and nobody else reads: free them
          relay->released = true;
          std::vector<v1::TensorChunk>().swap(relay->chunks);
        }
        return grpc::Status::OK;
      } else if (shutdown_ || relay->failed) {
        return Error(absl::UnavailableError("this worker's own parameter fetch failed"));
      } else {
        if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
        continue;
      }
    }
    if (!writer->Write(chunk)) return Error(absl::UnavailableError("the peer closed the stream"));
  }
}

// ---------------------------------------------------------------------------------------------
// Sums up the tree

grpc::Status PeerHub::ReceiveSum(grpc::ServerContext*, grpc::ServerReader<v1::SumChunk>* reader,
                                 v1::PushSumResponse* resp) {
  v1::SumChunk msg;
  if (!reader->Read(&msg) || !msg.has_header()) {
    return Error(absl::InvalidArgumentError("a sum stream must start with its header"));
  }
  const v1::SumHeader h = msg.header();
  std::shared_ptr<const GroupLayout> layout;
  AssemblerLimits limits;
  // A step this worker has not reached yet: the sender tries again. One it has left: refused.
  auto check = [&]() -> std::optional<grpc::Status> {
    if (step_.job_id == h.job_id() && step_.version > h.params_version()) {
      resp->set_accepted(false);
      return grpc::Status::OK;
    }
    if (!Current(h.job_id(), h.params_version())) {
      return Error(absl::UnavailableError("this worker has not reached that step yet"));
    }
    return std::nullopt;
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::optional<grpc::Status> early = check()) return *early;
    layout = step_.layout;
    limits.max_total_bytes = 2 * GroupBytes(*layout, h.group()) + (1 << 16);
    limits.max_tensor_bytes = limits.max_total_bytes;
    limits.max_tensors = MaxGroupTensors() + 1;
  }
  uint64_t bytes = 0;
  absl::StatusOr<TensorMap> tensors =
      ReadTensorStream<grpc::ServerReader<v1::SumChunk>, v1::SumChunk>(*reader, limits, "sum",
                                                                        &bytes);
  if (!tensors.ok()) return Error(tensors.status());
  absl::StatusOr<GroupValue<float>> value = TakeGroup(*layout, h.group(), *tensors);
  if (!value.ok()) return Error(value.status());
  std::lock_guard<std::mutex> lock(mu_);
  if (std::optional<grpc::Status> late = check()) return *late;
  std::vector<TreeReduce<float>::Send> out;
  bool fresh = false;
  if (absl::Status s = step_.reduce->Put(h.group(), h.lo(), h.hi(), *std::move(value), out, &fresh);
      !s.ok())
    return Error(s);
  Queue(out);
  ++stats_.sums_received;
  resp->set_accepted(fresh);
  return grpc::Status::OK;
}

v1::PeerService::Stub& PeerHub::PeerStub(const std::string& address) {
  std::unique_ptr<v1::PeerService::Stub>& stub = peers_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args = ClientChannelArgs();
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    if (!opt_.peer_tls_name.empty()) args.SetSslTargetNameOverride(opt_.peer_tls_name);
    stub = v1::PeerService::NewStub(grpc::CreateCustomChannel(
        address, opt_.credentials ? opt_.credentials : grpc::InsecureChannelCredentials(), args));
  }
  return *stub;
}

absl::Status PeerHub::Push(const Outgoing& o, bool* accepted) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, opt_.stream_deadline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return absl::CancelledError("shutting down");
    pushing_ = &ctx;
  }
  struct InFlight {  // until the call ends, Shutdown may cancel it
    std::mutex& mu;
    grpc::ClientContext*& pushing;
    std::condition_variable& ended;
    ~InFlight() {
      {
        std::lock_guard<std::mutex> lock(mu);
        pushing = nullptr;
      }
      ended.notify_all();
    }
  } in_flight{mu_, pushing_, cv_};
  v1::SumChunk msg;
  v1::SumHeader* h = msg.mutable_header();
  h->set_worker_id(state_.worker_id());
  h->set_job_id(o.job_id);
  h->set_params_version(o.version);
  h->set_group(o.send.group);
  h->set_lo(o.send.lo);
  h->set_hi(o.send.hi);
  const TensorMap tensors = PutGroup(*o.layout, o.send.group, o.send.value);
  auto stream = [&](grpc::ClientWriter<v1::SumChunk>& writer) {
    bool ok = writer.Write(msg);
    for (const auto& [name, tensor] : tensors) {
      if (!ok) break;
      ok = StreamTensor(name, tensor, kDefaultPieceBytes, [&](const v1::TensorChunk& c) {
             v1::SumChunk piece;
             *piece.mutable_tensor() = c;
             return writer.Write(piece) ? absl::OkStatus()
                                        : absl::UnavailableError("the stream broke");
           }).ok();
    }
    if (ok) writer.WritesDone();
    return FromGrpcStatus(writer.Finish());
  };
  if (o.address.empty()) {
    v1::PushResultResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::SumChunk>> writer =
        coordinator_.PushReduced(&ctx, &resp);
    absl::Status s = stream(*writer);
    *accepted = resp.accepted();
    return s;
  }
  v1::PeerService::Stub* stub;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stub = &PeerStub(o.address);
  }
  v1::PushSumResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::SumChunk>> writer = stub->PushSum(&ctx, &resp);
  absl::Status s = stream(*writer);
  *accepted = resp.accepted();
  return s;
}

void PeerHub::SendLoop() {
  for (;;) {
    Outgoing o;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return shutdown_ || !outgoing_.empty(); });
      if (shutdown_) return;
      o = std::move(outgoing_.front());
      outgoing_.pop_front();
    }
    Backoff backoff(milliseconds(5), milliseconds(500));
    for (;;) {
      bool accepted = false;
      const absl::Status s = Push(o, &accepted);
      std::unique_lock<std::mutex> lock(mu_);
      if (s.ok()) {
        ++(o.address.empty() ? stats_.roots_sent : stats_.sums_sent);
        break;
      }
      if (shutdown_ || !Current(o.job_id, o.version)) break;  // the step is over here
      if (!IsTransient(s.code()) && !absl::IsNotFound(s)) {
        state_.Log(0, absl::StrCat("the sum of spans [", o.send.lo, ", ", o.send.hi, ") of ",
                                   GroupName(o.send.group, o.layout->K), " to ",
                                   o.address.empty() ? "the coordinator" : o.address,
                                   " was refused: ", s.ToString()));
        break;
      }
      state_.Log(2, absl::StrCat("sum to ", o.address.empty() ? "the coordinator" : o.address,
                                 " failed (", s.ToString(), "); retrying"));
      cv_.wait_for(lock, backoff.Next(), [&] { return shutdown_; });
      if (shutdown_) break;
    }
  }
}

}  // namespace adjsh::worker
