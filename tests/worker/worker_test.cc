// The worker against a fake coordinator: a TaskService on 127.0.0.1 (real TCP gRPC) that serves
// exact-backward tasks built from a tiny model with GradientStep, and records what the worker
// sends. A worker's result must be bitwise RunBackwardTask run locally on the same inputs, in
// the contract's tensor order, names, shapes and dtype; and the worker must survive NoTask,
// lost leases, cancellation, unknown-worker answers, an unavailable coordinator, and stop
// promptly.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model.h"
#include "engine/backward_task.h"
#include "engine/gradient_step.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/adjsh.grpc.pb.h"
#include "proto/status_util.h"
#include "proto/tensor_codec.h"
#include "worker/worker.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int64_t kT = 40, kChunk = 16;

// D=8, K=2, N=4, W=4, R=2, V=11.
MambaConfig TinyConfig() { return adjsh::testing::SmallConfig(2, 8, 4, 4, 2, 11); }

// One task as the coordinator would serve it, with the outputs a local run gives.
struct TaskCase {
  v1::Task task;
  TensorMap inputs;                                  // "u", "g", "h0", maybe "mu"
  TensorMap params;                                  // layer k's parameters, HF names
  std::vector<std::pair<std::string, HostTensor>> expected;  // the result, in push order
};

// The tiny model's exact backward tasks, in task-id order, each gathered after the previous
// ones were applied (as a coordinator would), with the local RunBackwardTask outputs.
template <typename T>
std::vector<TaskCase> BuildCases(int64_t count) {
  const DType dtype = std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
  const MambaConfig config = TinyConfig();
  const ModelParams<T> params = InitParams<T>(config, 1234);
  std::vector<uint32_t> tokens(kT);
  for (int64_t t = 0; t < kT; ++t) tokens[t] = static_cast<uint32_t>((t * 7 + 3) % 11);
  GradOptions opt;
  opt.chunk = kChunk;
  opt.threads = 1;
  GradientStep<T> step(params, tokens, opt);
  step.ForwardAndHead();
  const TensorMap all_params = ParamsToTensors(params, dtype);
  const int64_t D = config.hidden_size, Di = config.inner(), N = config.state_size;
  std::vector<TaskCase> cases;
  for (int64_t id = 0; id < count; ++id) {
    BackwardTaskInputs<T> in;
    step.GatherInputs(id, in);
    const int64_t k = in.layer, c = in.chunk, halo = in.rows.halo, len = in.rows.len;
    TaskCase tc;
    v1::Task& task = tc.task;
    task.set_task_id(absl::StrCat("t", id));
    task.set_lease_id(absl::StrCat("lease-", id));
    task.set_lease_expires_ms(60000);
    task.set_job_id("job");
    task.set_kind(v1::Task::BACKWARD);
    task.set_layer(static_cast<int32_t>(k));
    task.set_chunk(c);
    task.set_t0(c * kChunk);
    task.set_len(len);
    task.set_halo(halo);
    task.set_dtype(ToProtoDType(dtype));
    task.set_params_version(7);
    task.set_context_length(kT);
    task.set_config_json(ConfigToJson(config));
    tc.inputs["u"] = HostTensor::From<T>(in.u, {halo + len, D}, dtype);
    tc.inputs["g"] = HostTensor::From<T>(in.g, {len, D}, dtype);
    tc.inputs["h0"] = HostTensor::From<T>(in.h0, {Di, N}, dtype);
    if (!in.mu.empty()) tc.inputs["mu"] = HostTensor::From<T>(in.mu, {Di, N}, dtype);
    for (const LayerParamSlot<T>& slot : LayerParamSlots<T>()) {
      const std::string name = LayerParamName(k, slot.suffix);
      tc.params[name] = all_params.at(name);
    }
    // The local run, with a block of its own (as the worker builds one).
    const cpu::MambaBlockCpu<T> block(config, params.layers[k]);
    BackwardTaskOutputs<T> out;
    RunBackwardTask(block, config, in, out);
    for (const LayerParamSlot<T>& slot : LayerParamSlots<T>()) {
      tc.expected.emplace_back(LayerParamName(k, slot.suffix),
                               HostTensor::From<T>(out.grad.*slot.member, slot.shape(config),
                                                   dtype));
    }
    tc.expected.emplace_back("du", HostTensor::From<T>(out.du, {len, D}, dtype));
    tc.expected.emplace_back("du_halo", HostTensor::From<T>(out.du_halo, {halo, D}, dtype));
    tc.expected.emplace_back("mu_out", HostTensor::From<T>(out.mu_out, {Di, N}, dtype));
    step.ApplyResult(id, out);
    cases.push_back(std::move(tc));
  }
  return cases;
}

struct Received {
  v1::ResultHeader header;
  std::vector<std::string> order;  // tensor names in stream order
  TensorMap tensors;
};

// A scripted TaskService. PullTask answers the script's entries in order, then NoTask.
class FakeTaskService final : public v1::TaskService::Service {
 public:
  struct Entry {
    enum Kind { kTask, kNoTask, kNotFound } kind = kNoTask;
    TaskCase tc;                // kTask
    int64_t retry_after_ms = 10;  // kNoTask
    bool lease_lost = false;      // FetchInputs answers FAILED_PRECONDITION
    bool cancel_by_heartbeat = false;  // a heartbeat naming it answers it cancelled
    // Once its result stream has begun, heartbeats answer it cancelled (as the coordinator does
    // once it has accepted the result), and the stream is read on only after one did.
    bool cancel_during_push = false;
    std::optional<uint64_t> params_version;  // overrides the task's
  };

  void Add(Entry e) {
    std::lock_guard<std::mutex> lock(mu_);
    script_.push_back(std::move(e));
  }
  void AddTask(const TaskCase& tc) {
    Entry e;
    e.kind = Entry::kTask;
    e.tc = tc;
    Add(std::move(e));
  }

  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++register_calls_;
    if (register_failures_ > 0) {
      --register_failures_;
      return ToGrpcStatus(absl::UnavailableError("coordinator starting"));
    }
    register_requests_.push_back(*req);
    const std::string id = absl::StrCat("w", register_requests_.size());
    workers_.insert(id);
    resp->set_worker_id(id);
    resp->set_heartbeat_interval_ms(heartbeat_ms_);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status PullTask(grpc::ServerContext*, const v1::PullTaskRequest* req,
                        v1::PullTaskResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++pulls_;
    cv_.notify_all();
    if (workers_.count(req->worker_id()) == 0) {
      return ToGrpcStatus(absl::NotFoundError("unknown worker " + req->worker_id()));
    }
    if (script_.empty()) {
      resp->mutable_no_task()->set_retry_after_ms(idle_retry_ms_);
      return grpc::Status::OK;
    }
    Entry e = std::move(script_.front());
    script_.pop_front();
    switch (e.kind) {
      case Entry::kNoTask:
        resp->mutable_no_task()->set_retry_after_ms(e.retry_after_ms);
        return grpc::Status::OK;
      case Entry::kNotFound:
        workers_.clear();  // as after a coordinator restart
        return ToGrpcStatus(absl::NotFoundError("unknown worker " + req->worker_id()));
      case Entry::kTask:
        break;
    }
    if (e.params_version) e.tc.task.set_params_version(*e.params_version);
    *resp->mutable_task() = e.tc.task;
    leased_[e.tc.task.task_id()] = std::move(e);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (workers_.count(req->worker_id()) == 0) {
      return ToGrpcStatus(absl::NotFoundError("unknown worker " + req->worker_id()));
    }
    heartbeats_.push_back(*req);
    for (const std::string& id : req->task_ids()) {
      auto it = leased_.find(id);
      if (it != leased_.end() && it->second.cancel_by_heartbeat) {
        resp->add_cancelled_task_ids(id);
        cancel_sent_at_.emplace(id, heartbeats_.size());
      }
    }
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status FetchInputs(grpc::ServerContext* ctx, const v1::FetchInputsRequest* req,
                           grpc::ServerWriter<v1::TensorChunk>* writer) override {
    std::vector<std::pair<std::string, HostTensor>> send;
    {
      std::unique_lock<std::mutex> lock(mu_);
      fetch_requests_.push_back(*req);
      auto it = leased_.find(req->task_id());
      if (it == leased_.end()) return ToGrpcStatus(absl::NotFoundError("unknown task"));
      const Entry& e = it->second;
      if (e.lease_lost || req->lease_id() != e.tc.task.lease_id()) {
        return ToGrpcStatus(absl::FailedPreconditionError("lease lost"));
      }
      if (e.cancel_by_heartbeat) {
        // Hold the inputs back until a heartbeat after the cancelling one: by then the worker
        // has processed the cancellation.
        // (The worker cancels the call when it drops the task: stop waiting then.)
        const std::string id = req->task_id();
        const Clock::time_point give_up = Clock::now() + std::chrono::seconds(10);
        for (;;) {
          auto c = cancel_sent_at_.find(id);
          if (c != cancel_sent_at_.end() && heartbeats_.size() > c->second) break;
          if (ctx->IsCancelled() || Clock::now() > give_up) break;
          cv_.wait_for(lock, milliseconds(10));
        }
      }
      for (const auto& [name, t] : e.tc.inputs) send.emplace_back(name, t);
      if (req->include_params()) {
        for (const auto& [name, t] : e.tc.params) send.emplace_back(name, t);
      }
    }
    for (const auto& [name, t] : send) {
      absl::Status s = StreamTensor(name, t, kDefaultPieceBytes, [&](const v1::TensorChunk& c) {
        return writer->Write(c) ? absl::OkStatus() : absl::CancelledError("client gone");
      });
      if (!s.ok()) return ToGrpcStatus(s);
    }
    return grpc::Status::OK;
  }

  grpc::Status PushResult(grpc::ServerContext* ctx, grpc::ServerReader<v1::ResultChunk>* reader,
                          v1::PushResultResponse* resp) override {
    v1::ResultChunk msg;
    if (!reader->Read(&msg) || !msg.has_header()) {
      return ToGrpcStatus(absl::InvalidArgumentError("a result stream starts with its header"));
    }
    Received r;
    r.header = msg.header();
    {
      std::unique_lock<std::mutex> lock(mu_);
      const std::string id = r.header.task_id();
      auto it = leased_.find(id);
      if (it != leased_.end() && it->second.cancel_during_push) {
        it->second.cancel_by_heartbeat = true;
        const Clock::time_point give_up = Clock::now() + std::chrono::seconds(10);
        for (;;) {
          auto c = cancel_sent_at_.find(id);
          if (c != cancel_sent_at_.end() && heartbeats_.size() > c->second) break;
          if (ctx->IsCancelled() || Clock::now() > give_up) break;
          cv_.wait_for(lock, milliseconds(10));
        }
      }
    }
    TensorAssembler assembler;
    while (reader->Read(&msg)) {
      if (!msg.has_tensor()) return ToGrpcStatus(absl::InvalidArgumentError("not a tensor"));
      absl::StatusOr<std::optional<NamedTensor>> done = assembler.Add(msg.tensor());
      if (!done.ok()) return ToGrpcStatus(done.status());
      if (done->has_value()) {
        r.order.push_back((*done)->name);
        r.tensors[(*done)->name] = std::move((*done)->tensor);
      }
    }
    if (absl::Status s = assembler.Finish(); !s.ok()) return ToGrpcStatus(s);
    std::lock_guard<std::mutex> lock(mu_);
    const std::string id = r.header.task_id();
    const bool first = results_.count(id) == 0;
    resp->set_accepted(first);
    if (!first) resp->set_reason("duplicate");
    if (first) results_[id] = std::move(r);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  // Waits (up to 20 s) until pred() holds, under the service's lock.
  template <typename Pred>
  bool WaitUntil(Pred pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return pred(); });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> script_;
  std::map<std::string, Entry> leased_;
  std::set<std::string> workers_;
  int64_t heartbeat_ms_ = 20;
  int64_t idle_retry_ms_ = 10;
  int register_failures_ = 0;
  int register_calls_ = 0;
  int pulls_ = 0;
  std::vector<v1::RegisterWorkerRequest> register_requests_;
  std::vector<v1::HeartbeatRequest> heartbeats_;
  std::map<std::string, size_t> cancel_sent_at_;  // task -> heartbeats seen when cancelled
  std::vector<v1::FetchInputsRequest> fetch_requests_;
  std::map<std::string, Received> results_;
};

class WorkerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer("127.0.0.1:0"); }

  void StartServer(const std::string& address) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  void TearDown() override {
    StopWorker();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  worker::WorkerOptions Options() const {
    worker::WorkerOptions o;
    o.coordinator = absl::StrCat("127.0.0.1:", port_);
    o.name = "test-worker";
    o.log_level = 2;
    o.log_every = 1;
    o.rpc_deadline = milliseconds(5000);
    o.stream_deadline = milliseconds(10000);
    return o;
  }

  void StartWorker() { StartWorker(Options()); }
  void StartWorker(const worker::WorkerOptions& o) {
    worker_ = std::make_unique<worker::Worker>(o);
    thread_ = std::thread([this] { run_status_ = worker_->Run(stop_); });
  }
  // Sets the stop flag and waits for Run to return; the time it took.
  milliseconds StopWorker() {
    if (!thread_.joinable()) return milliseconds(0);
    const Clock::time_point start = Clock::now();
    stop_.store(true);
    thread_.join();
    return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  }

  bool WaitForResult(const std::string& task_id) {
    return service_.WaitUntil([&] { return service_.results_.count(task_id) > 0; });
  }

  void ExpectBitwise(const TaskCase& tc) {
    std::lock_guard<std::mutex> lock(service_.mu_);
    auto it = service_.results_.find(tc.task.task_id());
    ASSERT_NE(it, service_.results_.end()) << tc.task.task_id();
    const Received& r = it->second;
    EXPECT_EQ(r.header.task_id(), tc.task.task_id());
    EXPECT_EQ(r.header.lease_id(), tc.task.lease_id());
    EXPECT_FALSE(r.header.worker_id().empty());
    std::vector<std::string> want_order;
    for (const auto& [name, t] : tc.expected) want_order.push_back(name);
    EXPECT_EQ(r.order, want_order);
    for (const auto& [name, want] : tc.expected) {
      auto got = r.tensors.find(name);
      ASSERT_NE(got, r.tensors.end()) << name;
      EXPECT_EQ(got->second.dtype, want.dtype) << name;
      EXPECT_EQ(got->second.shape, want.shape) << name;
      EXPECT_TRUE(got->second.data == want.data) << name << " differs";
    }
  }

  int ParamFetches() {
    std::lock_guard<std::mutex> lock(service_.mu_);
    int n = 0;
    for (const auto& f : service_.fetch_requests_) n += f.include_params() ? 1 : 0;
    return n;
  }

  FakeTaskService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<worker::Worker> worker_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  absl::Status run_status_ = absl::UnknownError("not run");
};

TEST_F(WorkerTest, F32ResultIsBitwiseTheLocalRun) {
  const std::vector<TaskCase> cases = BuildCases<float>(1);
  const TaskCase& tc = cases[0];
  ASSERT_EQ(tc.task.layer(), 1);  // task 0: the last layer's last chunk, no incoming adjoint
  ASSERT_EQ(tc.task.chunk(), 2);
  ASSERT_EQ(tc.inputs.count("mu"), 0u);
  service_.AddTask(tc);
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(tc);
  // A few heartbeats with memory figures.
  ASSERT_TRUE(service_.WaitUntil([&] { return service_.heartbeats_.size() >= 2; }));
  EXPECT_LT(StopWorker(), milliseconds(1000));
  EXPECT_TRUE(run_status_.ok()) << run_status_;
  std::lock_guard<std::mutex> lock(service_.mu_);
  ASSERT_EQ(service_.register_requests_.size(), 1u);
  EXPECT_EQ(service_.register_requests_[0].worker_name(), "test-worker");
  EXPECT_EQ(service_.register_requests_[0].device(), "cpu");
  EXPECT_GT(service_.register_requests_[0].memory_bytes(), 0u);
  ASSERT_EQ(service_.fetch_requests_.size(), 1u);
  const v1::FetchInputsRequest& f = service_.fetch_requests_[0];
  EXPECT_EQ(f.worker_id(), "w1");
  EXPECT_EQ(f.task_id(), "t0");
  EXPECT_EQ(f.lease_id(), "lease-0");
  EXPECT_TRUE(f.include_params());
  for (const v1::HeartbeatRequest& h : service_.heartbeats_) {
    EXPECT_EQ(h.worker_id(), "w1");
    EXPECT_GT(h.resident_bytes(), 0u);
    EXPECT_GE(h.peak_resident_bytes(), h.resident_bytes());
  }
  const worker::WorkerStats st = worker_->stats();
  EXPECT_EQ(st.tasks_done, 1);
  EXPECT_EQ(st.tasks_dropped, 0);
}

TEST_F(WorkerTest, F64TasksWithIncomingAdjointAreBitwiseTheLocalRun) {
  const std::vector<TaskCase> cases = BuildCases<double>(3);  // (1, 2), (1, 1), (1, 0)
  for (const TaskCase& tc : cases) service_.AddTask(tc);
  ASSERT_EQ(cases[1].inputs.count("mu"), 1u);
  ASSERT_EQ(cases[2].task.halo(), 0);
  StartWorker();
  for (const TaskCase& tc : cases) {
    ASSERT_TRUE(WaitForResult(tc.task.task_id())) << tc.task.task_id();
    ExpectBitwise(tc);
  }
}

TEST_F(WorkerTest, WaitsOnNoTaskThenServesTheTask) {
  const std::vector<TaskCase> cases = BuildCases<float>(1);
  for (int i = 0; i < 3; ++i) {
    FakeTaskService::Entry e;
    e.kind = FakeTaskService::Entry::kNoTask;
    e.retry_after_ms = 30;
    service_.Add(e);
  }
  service_.AddTask(cases[0]);
  const Clock::time_point start = Clock::now();
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  EXPECT_GE(Clock::now() - start, milliseconds(85));  // three waits of 30 ms (less jitter)
  ExpectBitwise(cases[0]);
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_GE(service_.pulls_, 4);
}

TEST_F(WorkerTest, LostLeaseDropsTheTaskAndTheWorkerGoesOn) {
  const std::vector<TaskCase> cases = BuildCases<float>(2);
  FakeTaskService::Entry lost;
  lost.kind = FakeTaskService::Entry::kTask;
  lost.tc = cases[0];
  lost.lease_lost = true;
  service_.Add(lost);
  service_.AddTask(cases[1]);
  StartWorker();
  ASSERT_TRUE(WaitForResult("t1"));
  ExpectBitwise(cases[1]);
  StopWorker();
  EXPECT_TRUE(run_status_.ok()) << run_status_;
  const worker::WorkerStats st = worker_->stats();
  EXPECT_EQ(st.tasks_dropped, 1);
  EXPECT_EQ(st.tasks_done, 1);
  // The lost fetch asked for the parameters; nothing was cached from it, so t1 asks again.
  EXPECT_EQ(ParamFetches(), 2);
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.results_.count("t0"), 0u);
}

TEST_F(WorkerTest, StopEndsAnIdleWorkerPromptly) {
  service_.idle_retry_ms_ = 60000;  // the worker sleeps a minute between pulls
  StartWorker();
  ASSERT_TRUE(service_.WaitUntil([&] { return service_.pulls_ >= 1; }));
  std::this_thread::sleep_for(milliseconds(50));
  const milliseconds took = StopWorker();
  EXPECT_LT(took, milliseconds(1000));
  EXPECT_TRUE(run_status_.ok()) << run_status_;
}

TEST_F(WorkerTest, StopWhileTheCoordinatorIsUnreachableIsPrompt) {
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
  StartWorker();  // registration fails and backs off
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_LT(StopWorker(), milliseconds(1000));
  EXPECT_TRUE(run_status_.ok()) << run_status_;
  EXPECT_EQ(worker_->stats().registrations, 0);
}

TEST_F(WorkerTest, ParametersAreFetchedOncePerLayerAndVersion) {
  const std::vector<TaskCase> cases = BuildCases<float>(4);  // (1,2) (1,1) (1,0) (0,2)
  service_.AddTask(cases[0]);  // version 7, layer 1: fetch
  service_.AddTask(cases[1]);  // version 7, layer 1: cached
  FakeTaskService::Entry newer;
  newer.kind = FakeTaskService::Entry::kTask;
  newer.tc = cases[2];
  newer.params_version = 8;  // a newer version: fetch (and 7 is evicted)
  service_.Add(newer);
  FakeTaskService::Entry other_layer;
  other_layer.kind = FakeTaskService::Entry::kTask;
  other_layer.tc = cases[3];
  other_layer.params_version = 8;  // layer 0 not cached yet: fetch
  service_.Add(other_layer);
  FakeTaskService::Entry older;
  older.kind = FakeTaskService::Entry::kTask;
  older.tc = cases[1];
  older.tc.task.set_task_id("t1-again");
  older.params_version = 7;  // evicted: fetch again
  service_.Add(older);
  StartWorker();
  for (const char* id : {"t0", "t1", "t2", "t3", "t1-again"}) ASSERT_TRUE(WaitForResult(id)) << id;
  for (const TaskCase& tc : cases) ExpectBitwise(tc);
  std::lock_guard<std::mutex> lock(service_.mu_);
  ASSERT_EQ(service_.fetch_requests_.size(), 5u);
  std::vector<bool> include;
  for (const auto& f : service_.fetch_requests_) include.push_back(f.include_params());
  EXPECT_EQ(include, (std::vector<bool>{true, false, true, true, true}));
}

TEST_F(WorkerTest, TaskCancelledByHeartbeatIsDropped) {
  const std::vector<TaskCase> cases = BuildCases<float>(2);
  FakeTaskService::Entry cancelled;
  cancelled.kind = FakeTaskService::Entry::kTask;
  cancelled.tc = cases[0];
  cancelled.cancel_by_heartbeat = true;
  service_.Add(cancelled);
  service_.AddTask(cases[1]);
  StartWorker();
  ASSERT_TRUE(WaitForResult("t1"));
  ExpectBitwise(cases[1]);
  StopWorker();
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.results_.count("t0"), 0u);
  EXPECT_EQ(worker_->stats().tasks_dropped, 1);
  // The heartbeats named the task while it was held, and not after the cancellation.
  bool named = false;
  const size_t cancelled_at = service_.cancel_sent_at_.at("t0");
  for (size_t i = 0; i < service_.heartbeats_.size(); ++i) {
    for (const std::string& id : service_.heartbeats_[i].task_ids()) {
      if (id == "t0") {
        named = true;
        EXPECT_LT(i, cancelled_at);
      }
    }
  }
  EXPECT_TRUE(named);
}

TEST_F(WorkerTest, CancelCrossingAnAcceptedResultDoesNotAbortItsPush) {
  // The coordinator accepts a result and the heartbeat answered meanwhile calls the task
  // cancelled (it is no longer leased: it is done). The push in flight is not cancelled: its
  // answer (accepted) counts, and the task is done, not dropped.
  const std::vector<TaskCase> cases = BuildCases<float>(1);
  FakeTaskService::Entry e;
  e.kind = FakeTaskService::Entry::kTask;
  e.tc = cases[0];
  e.cancel_during_push = true;
  service_.Add(e);
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(cases[0]);
  StopWorker();
  EXPECT_EQ(worker_->stats().tasks_done, 1);
  EXPECT_EQ(worker_->stats().tasks_dropped, 0);
  EXPECT_EQ(worker_->stats().results_rejected, 0);
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.cancel_sent_at_.count("t0"), 1u);  // the cancel did cross the push
}

TEST_F(WorkerTest, UnknownWorkerRegistersAgain) {
  const std::vector<TaskCase> cases = BuildCases<float>(1);
  FakeTaskService::Entry restart;
  restart.kind = FakeTaskService::Entry::kNotFound;
  service_.Add(restart);
  service_.AddTask(cases[0]);
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(cases[0]);
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.register_requests_.size(), 2u);
  EXPECT_EQ(service_.results_.at("t0").header.worker_id(), "w2");
}

TEST_F(WorkerTest, UnavailableRegistrationIsRetried) {
  const std::vector<TaskCase> cases = BuildCases<float>(1);
  service_.register_failures_ = 3;
  service_.AddTask(cases[0]);
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(cases[0]);
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.register_calls_, 4);
}

TEST_F(WorkerTest, ACoordinatorThatComesBackLaterIsFound) {
  const std::vector<TaskCase> cases = BuildCases<float>(1);
  const int port = port_;
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
  StartWorker();
  std::this_thread::sleep_for(milliseconds(500));  // connection refused, backing off
  StartServer(absl::StrCat("127.0.0.1:", port));
  service_.AddTask(cases[0]);
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(cases[0]);
}

TEST_F(WorkerTest, UnsupportedAndMalformedTasksAreSkipped) {
  const std::vector<TaskCase> cases = BuildCases<float>(3);
  FakeTaskService::Entry forward;  // another kind: skipped without a fetch
  forward.kind = FakeTaskService::Entry::kTask;
  forward.tc = cases[0];
  forward.tc.task.set_kind(v1::Task::FORWARD);
  service_.Add(forward);
  FakeTaskService::Entry bad_shape;  // "g" one row short: skipped after the fetch
  bad_shape.kind = FakeTaskService::Entry::kTask;
  bad_shape.tc = cases[1];
  HostTensor& g = bad_shape.tc.inputs["g"];
  g.shape[0] -= 1;
  g.data.resize(g.data.size() - 8 * 4);
  service_.Add(bad_shape);
  service_.AddTask(cases[2]);
  StartWorker();
  ASSERT_TRUE(WaitForResult("t2"));
  ExpectBitwise(cases[2]);
  StopWorker();
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.results_.size(), 1u);
  ASSERT_EQ(service_.fetch_requests_.size(), 2u);
  EXPECT_EQ(service_.fetch_requests_[0].task_id(), "t1");
  EXPECT_EQ(worker_->stats().tasks_dropped, 2);
}

}  // namespace
}  // namespace adjsh
