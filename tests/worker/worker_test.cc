// The worker against a fake coordinator: a TaskService on 127.0.0.1 (real TCP gRPC) that serves
// the (layer, span) tasks of one step of a tiny model (engine/span_plan.h), with the inputs a
// coordinator's SpanLedger gives them (engine/span_ledger.h) and the outputs SpanWork gives
// when run locally (engine/span_work.h), and records what the worker sends. A worker's result
// must be bitwise the local run, under the contract's names, shapes and dtypes
// (engine/span_tensors.h); it must fetch the model once per params_version and a span's start
// only when it does not hold the span ready for the task; and it must survive NoTask, lost
// leases, cancellation, unknown-worker answers, an unavailable coordinator, bad tasks, and stop
// promptly.
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/mamba2_config.h"
#include "common/model.h"
#include "common/mamba2_init.h"
#include "common/mamba2_model.h"
#include "engine/span_work.h"
#include "engine/span_ledger.h"
#include "engine/span_plan.h"
#include "engine/span_tensors.h"
#include "engine/span_work.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/mamba2_chunk_ops.h"
#include "kernels/mamba_chunk_ops.h"
#include "proto/adjsh.grpc.pb.h"
#include "proto/status_util.h"
#include "proto/tensor_codec.h"
#include "worker/worker.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// T=40 in chunks of 8 cut into 3 spans: span 0 = tokens [0, 8), span 1 = [8, 24), span 2 =
// [24, 40). 20 tasks (ids in engine/span_plan.h's order): 0, 1 the forward summaries of layer
// 0 (spans 0, 1), 2-4 its forwards (spans 0-2), 5-9 the same for layer 1 (7-9 with the head),
// 10, 11 the backward summaries of layer 1 (spans 2, 1), 12-14 its backwards (spans 2-0),
// 15-19 the same for layer 0.
constexpr int64_t kT = 40, kChunk = 8, kSpans = 3, kTasks = 20;

// D=8, K=2, N=4, W=4, R=2, V=11.
MambaConfig TinyConfig() { return adjsh::testing::SmallConfig(2, 8, 4, 4, 2, 11); }

// One task as the coordinator would serve it, with the result a local run gives.
struct TaskCase {
  v1::Task task;
  TensorMap inputs;      // the task's own inputs (PutSpanInputs)
  TensorMap span_start;  // "tokens" and the replay's inputs ("replay.<phase>.<k>.<name>")
  TensorMap expected;    // PutSpanResult of the local run, timings 0
  const TensorMap* params = nullptr;  // its step's parameters (StepCases::params)
};

struct StepCases {
  TensorMap params;             // every parameter under its HF name, F32
  std::vector<TaskCase> tasks;  // by task id
};

// The step's tasks in id order (a topological order: every dependency has a lower id), each
// one's inputs taken from a SpanLedger after the earlier results were applied, as a coordinator
// does, and run on the span's work (SpanWork, Mamba2SpanWork: make_work) as its owner would.
template <template <typename> class P, typename Config, typename MakeWork>
StepCases BuildCasesOf(const Config& config, const P<float>& params, TensorMap param_tensors,
                       const std::string& config_json, MakeWork make_work) {
  std::vector<uint32_t> tokens(kT);
  for (int64_t t = 0; t < kT; ++t) tokens[t] = static_cast<uint32_t>((t * 7 + 3) % 11);
  const SpanPlan plan =
      SpanPlan::Make(kT, kChunk, kSpans, config.num_hidden_layers, config.conv_kernel).value();
  SpanLedger<float, P> ledger(params, plan, tokens, {});
  std::vector<decltype(make_work(plan, ledger, 0))> work(kSpans);
  StepCases cases;
  cases.params = std::move(param_tensors);
  const v1::Task::Kind kinds[] = {v1::Task::SPAN_FORWARD_SUMMARY, v1::Task::SPAN_FORWARD,
                                  v1::Task::SPAN_BACKWARD_SUMMARY, v1::Task::SPAN_BACKWARD};
  for (int64_t id = 0; id < plan.num_tasks(); ++id) {
    const SpanTask& st = plan.task(id);
    const int64_t s = st.span;
    TaskCase tc;
    v1::Task& task = tc.task;
    task.set_task_id(absl::StrCat("t", id));
    task.set_lease_id(absl::StrCat("lease-", id));
    task.set_lease_expires_ms(60000);
    task.set_job_id("job");
    task.set_step(0);
    task.set_kind(kinds[static_cast<int>(st.phase)]);
    task.set_layer(static_cast<int32_t>(st.layer));
    task.set_span(s);
    task.set_spans(kSpans);
    task.set_chunk(kChunk);
    task.set_targets(ledger.n_targets());
    task.set_masked(false);
    task.set_storage("full");
    task.set_dtype(v1::F32);
    task.set_params_version(7);
    task.set_context_length(kT);
    task.set_config_json(config_json);
    const SpanInputs<float> in = ledger.Inputs(id);
    PutSpanInputs<float>(config, plan, st, in, "", tc.inputs);
    PutSpanStart(ledger.SpanTokens(s), ledger.SpanMask(s), tc.span_start);
    for (const auto& [step, step_in] : ledger.Replay(id))
      PutSpanInputs<float>(config, plan, step, step_in, ReplayPrefix(step), tc.span_start);
    if (!work[s]) work[s] = make_work(plan, ledger, s);
    SpanResultOf<float, Config> r;
    const absl::Status run = work[s]->Run(st, in, r.out);
    EXPECT_TRUE(run.ok()) << run;
    tc.expected = PutSpanResult<float>(config, plan, st, r);
    ledger.Apply(id, std::move(r.out));
    cases.tasks.push_back(std::move(tc));
  }
  return cases;
}

StepCases BuildCases() {
  const MambaConfig config = TinyConfig();
  const ModelParams<float> params = InitParams<float>(config, 1234);
  const std::unique_ptr<Backend<float>> backend = MakeBackend<float>(Device{}).value();
  const LayerModel<ModelParams<float>> model = MakeLayerModel(params, *backend);
  return BuildCasesOf<ModelParams>(
      config, params, ParamsToTensors<float>(params, DType::kF32), ConfigToJson(config),
      [&](const SpanPlan& plan, const SpanLedger<float>& ledger, int64_t s) {
        return std::make_unique<SpanWork<float>>(model, plan, s, ledger.SpanTokens(s),
                                                 ledger.SpanMask(s), ledger.n_targets(),
                                                 Storage::kCompute, "");
      });
}

// The same step of a tiny Mamba-2 model: D=8, K=2, N=4, head_dim 4 (H=4), G=2, W=4, V=11,
// untied.
StepCases BuildMamba2Cases() {
  Mamba2Config config;
  config.hidden_size = 8, config.num_hidden_layers = 2, config.state_size = 4;
  config.head_dim = 4, config.num_heads = 4, config.n_groups = 2, config.vocab_size = 11;
  Mamba2Params<float> params = InitMamba2Params<float>(config, 99).value();
  TensorMap tensors = Mamba2ParamsToTensors<float>(params, DType::kF32);
  const std::unique_ptr<Backend<float>> backend = MakeBackend<float>(Device{}).value();
  const LayerModel<Mamba2Params<float>> model = MakeLayerModel(params, *backend).value();
  return BuildCasesOf<Mamba2Params>(
      config, params, std::move(tensors), Mamba2ConfigToJson(config),
      [&](const SpanPlan& plan, const SpanLedger<float, Mamba2Params>& ledger, int64_t s) {
        return std::make_unique<Mamba2SpanWork<float>>(model, plan, s, ledger.SpanTokens(s),
                                                       ledger.SpanMask(s), ledger.n_targets(),
                                                       Storage::kCompute, "");
      });
}

// Built once: every test serves the same step (a Mamba-1 model's, or a Mamba-2 one's), each
// task pointing at its step's parameters.
const StepCases& Cases() {
  static const StepCases* cases = [] {
    auto* c = new StepCases(BuildCases());
    for (TaskCase& tc : c->tasks) tc.params = &c->params;
    return c;
  }();
  return *cases;
}
const StepCases& Mamba2Cases() {
  static const StepCases* cases = [] {
    auto* c = new StepCases(BuildMamba2Cases());
    for (TaskCase& tc : c->tasks) tc.params = &c->params;
    return c;
  }();
  return *cases;
}

// Task `id` under another task id (and lease id) and parameter version.
TaskCase Renamed(int64_t id, const std::string& task_id, uint64_t version) {
  TaskCase tc = Cases().tasks[id];
  tc.task.set_task_id(task_id);
  tc.task.set_lease_id("lease-" + task_id);
  tc.task.set_params_version(version);
  return tc;
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
    for (const v1::SkippedTask& s : req->skipped()) skipped_.push_back(s);
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
        for (const auto& [name, t] : *e.tc.params) send.emplace_back(name, t);
      }
      if (req->include_span()) {
        for (const auto& [name, t] : e.tc.span_start) send.emplace_back(name, t);
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
  std::vector<v1::SkippedTask> skipped_;  // as the pulls said them
  std::map<std::string, Received> results_;
};

class WorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Cases();  // the local run first (this also makes BLAS single-threaded for the process)
    StartServer("127.0.0.1:0");
  }

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

  // The worker's result for tc's task: the tensors of the local run, bitwise, in the stream
  // order (by name); the two timings F64 scalars, finite and >= 0.
  void ExpectBitwise(const TaskCase& tc) {
    std::lock_guard<std::mutex> lock(service_.mu_);
    const std::string& id = tc.task.task_id();
    auto it = service_.results_.find(id);
    ASSERT_NE(it, service_.results_.end()) << id;
    const Received& r = it->second;
    EXPECT_EQ(r.header.task_id(), id);
    EXPECT_EQ(r.header.lease_id(), tc.task.lease_id());
    EXPECT_FALSE(r.header.worker_id().empty());
    std::vector<std::string> want_order;
    for (const auto& [name, t] : tc.expected) want_order.push_back(name);
    EXPECT_EQ(r.order, want_order) << id;
    for (const auto& [name, want] : tc.expected) {
      auto got = r.tensors.find(name);
      ASSERT_NE(got, r.tensors.end()) << id << " " << name;
      EXPECT_EQ(got->second.dtype, want.dtype) << id << " " << name;
      EXPECT_EQ(got->second.shape, want.shape) << id << " " << name;
      if (name == "compute_seconds" || name == "rebuild_seconds") {
        const double v = ScalarLocked(r, name);
        EXPECT_TRUE(std::isfinite(v) && v >= 0) << id << " " << name << " = " << v;
        continue;
      }
      EXPECT_TRUE(got->second.data == want.data) << id << " " << name << " differs";
    }
  }

  // An F64 scalar of a received result (mu_ held).
  static double ScalarLocked(const Received& r, const std::string& name) {
    auto it = r.tensors.find(name);
    if (it == r.tensors.end() || it->second.data.size() != sizeof(double)) return -1;
    double v = 0;
    std::memcpy(&v, it->second.data.data(), sizeof(double));
    return v;
  }
  double RebuildSeconds(const std::string& task_id) {
    std::lock_guard<std::mutex> lock(service_.mu_);
    auto it = service_.results_.find(task_id);
    return it == service_.results_.end() ? -1 : ScalarLocked(it->second, "rebuild_seconds");
  }

  // (include_params, include_span) of every FetchInputs so far, in order.
  std::vector<std::pair<bool, bool>> Includes() {
    std::lock_guard<std::mutex> lock(service_.mu_);
    std::vector<std::pair<bool, bool>> v;
    for (const auto& f : service_.fetch_requests_) v.emplace_back(f.include_params(), f.include_span());
    return v;
  }

  int ParamFetches() {
    int n = 0;
    for (const auto& [params, span] : Includes()) n += params ? 1 : 0;
    return n;
  }

  const TaskCase& Task(int64_t id) const { return Cases().tasks[id]; }

  FakeTaskService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<worker::Worker> worker_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  absl::Status run_status_ = absl::UnknownError("not run");
};

// Every task of a step, in id order, to one worker: each result bitwise the local run.
TEST_F(WorkerTest, AStepsTasksAreBitwiseTheLocalRun) {
  ASSERT_EQ(static_cast<int64_t>(Cases().tasks.size()), kTasks);
  std::set<v1::Task::Kind> kinds;
  for (const TaskCase& tc : Cases().tasks) {
    service_.AddTask(tc);
    kinds.insert(tc.task.kind());
  }
  EXPECT_EQ(kinds.size(), 4u);  // every kind of task
  StartWorker();
  for (const TaskCase& tc : Cases().tasks) {
    ASSERT_TRUE(WaitForResult(tc.task.task_id())) << tc.task.task_id();
    ExpectBitwise(tc);
    EXPECT_EQ(RebuildSeconds(tc.task.task_id()), 0.0) << "the worker kept every span";
  }
  // A few heartbeats with memory figures.
  ASSERT_TRUE(service_.WaitUntil([&] { return service_.heartbeats_.size() >= 2; }));
  EXPECT_LT(StopWorker(), milliseconds(1000));
  EXPECT_TRUE(run_status_.ok()) << run_status_;
  std::lock_guard<std::mutex> lock(service_.mu_);
  ASSERT_EQ(service_.register_requests_.size(), 1u);
  EXPECT_EQ(service_.register_requests_[0].worker_name(), "test-worker");
  EXPECT_EQ(service_.register_requests_[0].device(), "cpu");
  EXPECT_GT(service_.register_requests_[0].memory_bytes(), 0u);
  ASSERT_EQ(service_.fetch_requests_.size(), static_cast<size_t>(kTasks));
  const v1::FetchInputsRequest& f = service_.fetch_requests_[0];
  EXPECT_EQ(f.worker_id(), "w1");
  EXPECT_EQ(f.task_id(), "t0");
  EXPECT_EQ(f.lease_id(), "lease-0");
  EXPECT_TRUE(f.include_params());
  EXPECT_TRUE(f.include_span());
  for (const v1::HeartbeatRequest& h : service_.heartbeats_) {
    EXPECT_EQ(h.worker_id(), "w1");
    EXPECT_GT(h.resident_bytes(), 0u);
    EXPECT_GE(h.peak_resident_bytes(), h.resident_bytes());
  }
  const worker::WorkerStats st = worker_->stats();
  EXPECT_EQ(st.tasks_pulled, kTasks);
  EXPECT_EQ(st.tasks_done, kTasks);
  EXPECT_EQ(st.results_rejected, 0);
  EXPECT_EQ(st.tasks_dropped, 0);
  EXPECT_EQ(st.params_fetched, 1);
}

TEST_F(WorkerTest, WaitsOnNoTaskThenServesTheTask) {
  for (int i = 0; i < 3; ++i) {
    FakeTaskService::Entry e;
    e.kind = FakeTaskService::Entry::kNoTask;
    e.retry_after_ms = 30;
    service_.Add(e);
  }
  service_.AddTask(Task(0));
  const Clock::time_point start = Clock::now();
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  EXPECT_GE(Clock::now() - start, milliseconds(85));  // three waits of 30 ms (less jitter)
  ExpectBitwise(Task(0));
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_GE(service_.pulls_, 4);
}

TEST_F(WorkerTest, LostLeaseDropsTheTaskAndTheWorkerGoesOn) {
  FakeTaskService::Entry lost;
  lost.kind = FakeTaskService::Entry::kTask;
  lost.tc = Task(0);
  lost.lease_lost = true;
  service_.Add(lost);
  service_.AddTask(Task(1));
  StartWorker();
  ASSERT_TRUE(WaitForResult("t1"));
  ExpectBitwise(Task(1));
  StopWorker();
  EXPECT_TRUE(run_status_.ok()) << run_status_;
  const worker::WorkerStats st = worker_->stats();
  EXPECT_EQ(st.tasks_dropped, 1);
  EXPECT_EQ(st.tasks_done, 1);
  // The lost fetch asked for the model; nothing was kept from it, so t1 asks again.
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

// include_params only on the first task of a params_version, include_span only on a span's
// first task of that version (the worker keeps the model and its spans between tasks); a task
// of an older version than the one held is stale: skipped without a fetch.
TEST_F(WorkerTest, TheModelIsFetchedOncePerVersionAndASpansTokensOncePerSpan) {
  for (const TaskCase& tc : Cases().tasks) service_.AddTask(tc);  // version 7
  const TaskCase v8_0 = Renamed(0, "v8-t0", 8), v8_1 = Renamed(1, "v8-t1", 8),
                 v8_2 = Renamed(2, "v8-t2", 8), stale = Renamed(2, "stale-t2", 7);
  service_.AddTask(v8_0);   // a new version: the model and span 0 again
  service_.AddTask(v8_1);   // span 1 again
  service_.AddTask(stale);  // version 7 after 8: skipped
  service_.AddTask(v8_2);   // span 0, held and ready
  StartWorker();
  for (const TaskCase& tc : Cases().tasks) {
    ASSERT_TRUE(WaitForResult(tc.task.task_id())) << tc.task.task_id();
    ExpectBitwise(tc);
  }
  // The same model under version 8: the same results.
  for (const TaskCase* tc : {&v8_0, &v8_1, &v8_2}) {
    ASSERT_TRUE(WaitForResult(tc->task.task_id())) << tc->task.task_id();
    ExpectBitwise(*tc);
  }
  StopWorker();
  // Version 7: the model with t0; each span's start with its first task (span 0: t0, span 1:
  // t1, span 2: t4, its forward of layer 0: the last span has no forward summary).
  std::vector<std::pair<bool, bool>> want(kTasks, {false, false});
  want[0] = {true, true};
  want[1] = {false, true};
  want[4] = {false, true};
  // Version 8.
  want.push_back({true, true});
  want.push_back({false, true});
  want.push_back({false, false});
  EXPECT_EQ(Includes(), want);
  const worker::WorkerStats st = worker_->stats();
  EXPECT_EQ(st.params_fetched, 2);
  EXPECT_EQ(st.tasks_dropped, 1);
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.results_.count("stale-t2"), 0u);
}

// A step of two sequences (a batch: proto/adjsh.proto Task.sequence), their tasks interleaved:
// the worker keeps a plan and spans per sequence, so span s of one is never taken for span s
// of the other; each result is bitwise the local run, the model comes once and each
// sequence's span starts once. A task of a sequence outside the step's is skipped.
TEST_F(WorkerTest, TheSequencesOfAStepKeepTheirOwnSpans) {
  auto of_sequence = [](int64_t id, int64_t b) {
    TaskCase tc = Renamed(id, absl::StrCat("s", b, "-t", id), 7);
    tc.task.set_sequence(b);
    tc.task.set_sequences(2);
    return tc;
  };
  FakeTaskService::Entry outside;
  outside.kind = FakeTaskService::Entry::kTask;
  outside.tc = of_sequence(0, 0);
  outside.tc.task.set_task_id("seq-2-of-2");
  outside.tc.task.set_sequence(2);
  service_.Add(outside);
  std::vector<TaskCase> cases;
  for (int64_t id = 0; id < kTasks; ++id) {
    for (int64_t b = 0; b < 2; ++b) {
      cases.push_back(of_sequence(id, b));
      service_.AddTask(cases.back());
    }
  }
  StartWorker();
  for (const TaskCase& tc : cases) {
    ASSERT_TRUE(WaitForResult(tc.task.task_id())) << tc.task.task_id();
    ExpectBitwise(tc);
    EXPECT_EQ(RebuildSeconds(tc.task.task_id()), 0.0) << tc.task.task_id();
  }
  StopWorker();
  // Each sequence's span starts with its first task (span 0: t0, span 1: t1, span 2: t4).
  std::vector<std::pair<bool, bool>> want;
  for (int64_t id = 0; id < kTasks; ++id) {
    for (int64_t b = 0; b < 2; ++b) {
      const bool start = id == 0 || id == 1 || id == 4;
      want.push_back({id == 0 && b == 0, start});
    }
  }
  EXPECT_EQ(Includes(), want);
  const worker::WorkerStats st = worker_->stats();
  EXPECT_EQ(st.params_fetched, 1);
  EXPECT_EQ(st.tasks_dropped, 1);
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.results_.count("seq-2-of-2"), 0u);
}

// A span the worker holds but not ready for its task (here: span 2 after layer 0's forward,
// handed its backward of layer 1) is fetched with its start and rebuilt by replaying the
// forward of both layers; its result is still bitwise the local run, with rebuild_seconds > 0,
// and the span goes on from there without another fetch of its start.
TEST_F(WorkerTest, ASpanNotReadyForItsTaskIsRebuilt) {
  service_.AddTask(Task(4));   // F(0, 2): span 2's first task
  service_.AddTask(Task(12));  // B(1, 2): needs layer 1's forward and the head first
  service_.AddTask(Task(17));  // B(0, 2): right after B(1, 2) on the same span
  ASSERT_EQ(Task(12).task.kind(), v1::Task::SPAN_BACKWARD);
  ASSERT_EQ(Task(12).task.span(), 2);
  ASSERT_TRUE(Task(12).span_start.contains("replay.fwd.0.h0"));
  ASSERT_TRUE(Task(12).span_start.contains("replay.fwd.1.halo_u"));
  StartWorker();
  for (int64_t id : {4, 12, 17}) {
    ASSERT_TRUE(WaitForResult(Task(id).task.task_id())) << id;
    ExpectBitwise(Task(id));
  }
  EXPECT_EQ(RebuildSeconds("t4"), 0.0);  // a span's first task makes it: no rebuild
  EXPECT_GT(RebuildSeconds("t12"), 0.0);
  EXPECT_EQ(RebuildSeconds("t17"), 0.0);
  EXPECT_EQ(Includes(), (std::vector<std::pair<bool, bool>>{{true, true}, {false, true},
                                                            {false, false}}));
}

// A Mamba-2 model's step (its config_json's model_type "mamba2"): every task in order to one
// worker, each result bitwise the local run of Mamba2SpanWork (engine/span_work.h over engine/span_math.h)
// under Mamba-2's names; the model fetched once, each span's start with its first task.
TEST_F(WorkerTest, AMamba2StepsTasksAreBitwiseTheLocalRun) {
  ASSERT_EQ(static_cast<int64_t>(Mamba2Cases().tasks.size()), kTasks);
  ASSERT_TRUE(Mamba2Cases().params.contains("lm_head.weight"));  // untied: shipped too
  for (const TaskCase& tc : Mamba2Cases().tasks) service_.AddTask(tc);
  StartWorker();
  for (const TaskCase& tc : Mamba2Cases().tasks) {
    ASSERT_TRUE(WaitForResult(tc.task.task_id())) << tc.task.task_id();
    ExpectBitwise(tc);
    EXPECT_EQ(RebuildSeconds(tc.task.task_id()), 0.0) << "the worker kept every span";
  }
  StopWorker();
  std::vector<std::pair<bool, bool>> want(kTasks, {false, false});
  want[0] = {true, true};
  want[1] = {false, true};
  want[4] = {false, true};
  EXPECT_EQ(Includes(), want);
  EXPECT_EQ(worker_->stats().params_fetched, 1);
  EXPECT_EQ(worker_->stats().tasks_done, kTasks);
}

// As ASpanNotReadyForItsTaskIsRebuilt, for a Mamba-2 span: rebuilt from its tokens and the
// replay's inputs, bitwise.
TEST_F(WorkerTest, AMamba2SpanNotReadyForItsTaskIsRebuilt) {
  const auto task = [](int64_t id) { return Mamba2Cases().tasks[id]; };
  service_.AddTask(task(4));   // F(0, 2): span 2's first task
  service_.AddTask(task(12));  // B(1, 2): needs layer 1's forward and the head first
  service_.AddTask(task(17));  // B(0, 2)
  StartWorker();
  for (int64_t id : {4, 12, 17}) {
    ASSERT_TRUE(WaitForResult(task(id).task.task_id())) << id;
    ExpectBitwise(task(id));
  }
  EXPECT_EQ(RebuildSeconds("t4"), 0.0);
  EXPECT_GT(RebuildSeconds("t12"), 0.0);
  EXPECT_EQ(RebuildSeconds("t17"), 0.0);
  EXPECT_EQ(Includes(), (std::vector<std::pair<bool, bool>>{{true, true}, {false, true},
                                                            {false, false}}));
}

// A Mamba-2 step reduces through the coordinator: a task naming a worker tree is skipped
// (no result), and the worker serves the next task.
// A Mamba-2 step may reduce among the workers (tests/faults/test_determinism.py runs it), but a
// task whose tree does not fit its plan (an owner short) is skipped, as a Mamba-1 task's is.
TEST_F(WorkerTest, AMamba2TaskWhoseTreeDoesNotFitItsPlanIsSkipped) {
  TaskCase treed = Mamba2Cases().tasks[0];
  treed.task.set_task_id("treed");
  treed.task.mutable_tree()->add_peer("127.0.0.1:1");
  for (int64_t s = 0; s + 1 < kSpans; ++s) treed.task.mutable_tree()->add_span_owner(0);
  service_.AddTask(treed);
  service_.AddTask(Mamba2Cases().tasks[0]);
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(Mamba2Cases().tasks[0]);
  StopWorker();
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.results_.count("treed"), 0u);
}

TEST_F(WorkerTest, TaskCancelledByHeartbeatIsDropped) {
  FakeTaskService::Entry cancelled;
  cancelled.kind = FakeTaskService::Entry::kTask;
  cancelled.tc = Task(0);
  cancelled.cancel_by_heartbeat = true;
  service_.Add(cancelled);
  service_.AddTask(Task(1));
  StartWorker();
  ASSERT_TRUE(WaitForResult("t1"));
  ExpectBitwise(Task(1));
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
  FakeTaskService::Entry e;
  e.kind = FakeTaskService::Entry::kTask;
  e.tc = Task(0);
  e.cancel_during_push = true;
  service_.Add(e);
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(Task(0));
  StopWorker();
  EXPECT_EQ(worker_->stats().tasks_done, 1);
  EXPECT_EQ(worker_->stats().tasks_dropped, 0);
  EXPECT_EQ(worker_->stats().results_rejected, 0);
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.cancel_sent_at_.count("t0"), 1u);  // the cancel did cross the push
}

TEST_F(WorkerTest, UnknownWorkerRegistersAgain) {
  FakeTaskService::Entry restart;
  restart.kind = FakeTaskService::Entry::kNotFound;
  service_.Add(restart);
  service_.AddTask(Task(0));
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(Task(0));
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.register_requests_.size(), 2u);
  EXPECT_EQ(service_.results_.at("t0").header.worker_id(), "w2");
}

TEST_F(WorkerTest, UnavailableRegistrationIsRetried) {
  service_.register_failures_ = 3;
  service_.AddTask(Task(0));
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(Task(0));
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.register_calls_, 4);
}

TEST_F(WorkerTest, ACoordinatorThatComesBackLaterIsFound) {
  const int port = port_;
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
  StartWorker();
  std::this_thread::sleep_for(milliseconds(500));  // connection refused, backing off
  StartServer(absl::StrCat("127.0.0.1:", port));
  service_.AddTask(Task(0));
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(Task(0));
}

// Tasks this worker cannot run are logged and skipped without a result: those it can tell
// from the task alone before any fetch, one whose inputs do not fit the contract after it.
TEST_F(WorkerTest, UnsupportedAndMalformedTasksAreSkipped) {
  auto bad = [&](const std::string& id, auto edit) {
    FakeTaskService::Entry e;
    e.kind = FakeTaskService::Entry::kTask;
    e.tc = Renamed(0, id, 7);
    edit(e.tc);
    service_.Add(e);
  };
  bad("no-kind", [](TaskCase& tc) { tc.task.set_kind(v1::Task::KIND_UNSPECIFIED); });
  bad("span-5-of-3", [](TaskCase& tc) { tc.task.set_span(5); });
  bad("layer-7", [](TaskCase& tc) { tc.task.set_layer(7); });
  bad("f64", [](TaskCase& tc) { tc.task.set_dtype(v1::F64); });  // workers compute in f32
  bad("bad-config", [](TaskCase& tc) { tc.task.set_config_json("{\"hidden_size\": "); });
  FakeTaskService::Entry bad_shape;  // "h0" one row short: skipped after the fetch
  bad_shape.kind = FakeTaskService::Entry::kTask;
  bad_shape.tc = Task(3);  // F(0, 1): reads h0 (16, 4)
  HostTensor& h0 = bad_shape.tc.inputs.at("h0");
  h0.shape[0] -= 1;
  h0.data.resize(h0.data.size() - 4 * 4);
  service_.Add(bad_shape);
  service_.AddTask(Task(0));
  StartWorker();
  ASSERT_TRUE(WaitForResult("t0"));
  ExpectBitwise(Task(0));
  StopWorker();
  std::lock_guard<std::mutex> lock(service_.mu_);
  EXPECT_EQ(service_.results_.size(), 1u);
  ASSERT_EQ(service_.fetch_requests_.size(), 2u);
  EXPECT_EQ(service_.fetch_requests_[0].task_id(), "t3");
  EXPECT_EQ(service_.fetch_requests_[1].task_id(), "t0");
  // The model came with t3 and was kept; span 1 is not span 0.
  EXPECT_TRUE(service_.fetch_requests_[0].include_params());
  EXPECT_FALSE(service_.fetch_requests_[1].include_params());
  EXPECT_TRUE(service_.fetch_requests_[1].include_span());
  EXPECT_EQ(worker_->stats().tasks_dropped, 6);
  // Each skip told the coordinator on the next pull, with its lease and why, once.
  std::vector<std::string> told;
  for (const v1::SkippedTask& s : service_.skipped_) {
    told.push_back(s.task_id());
    EXPECT_FALSE(s.lease_id().empty()) << s.task_id();
    EXPECT_FALSE(s.reason().empty()) << s.task_id();
  }
  EXPECT_EQ(told, (std::vector<std::string>{"no-kind", "span-5-of-3", "layer-7", "f64",
                                            "bad-config", "t3"}));
}

}  // namespace
}  // namespace adjsh
