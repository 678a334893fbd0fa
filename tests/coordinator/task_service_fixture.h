// The TaskService over real gRPC (127.0.0.1, a selected port) with a gradient in flight, for
// tests that act as workers through a stub: TaskServiceWireTest starts the service, runs
// TaskServiceImpl::ComputeGradient for a tiny model on a background thread, and gives the
// calls a worker makes (register, pull, heartbeat, fetch, push) and a fake well-behaved worker
// that runs the span tasks the way worker/task_runner.cc does: it keeps a SpanWork per span it
// has been handed (engine/span_work.h), fetches the model once per params_version and a span's
// start (tokens and replay) only when it lacks the span or the span is not Ready for the task,
// and returns PutSpanResult's tensors (engine/span_tensors.h). Included by
// task_service_test.cc, task_service_hostile_test.cc and task_service_batch_test.cc (one test
// binary each).
#ifndef ADJSH_TESTS_COORDINATOR_TASK_SERVICE_FIXTURE_H_
#define ADJSH_TESTS_COORDINATOR_TASK_SERVICE_FIXTURE_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/model.h"
#include "coordinator/task_service.h"
#include "engine/adjoint_engine.h"
#include "engine/span_plan.h"
#include "engine/span_tensors.h"
#include "engine/span_work.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/mamba_chunk_ops.h"
#include "proto/adjsh.grpc.pb.h"
#include "proto/span_kind.h"
#include "proto/status_util.h"
#include "proto/tensor_codec.h"
#include "tests/common/test_util.h"
#include "tests/kernels/test_util.h"

namespace adjsh::coordinator {

using ::adjsh::testing::StatusIs;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// D=8, K=2, N=4, W=4, R=2, V=11; T=40 in chunks of C=8 (5 chunks) cut into S=3 spans:
// span 0 = chunk 0 (tokens [0, 8), no halo), span 1 = chunks 1-2 ([8, 24), halo 3), span 2 =
// chunks 3-4 ([24, 40), halo 3). Per layer 2 forward summaries (spans 0, 1), 3 forwards, 2
// backward summaries (spans 2, 1) and 3 backwards: 4 kinds x 2 layers = 20 tasks
// (engine/span_plan.h), ids 0..9 the forward (layer 0 then 1), 10..19 the backward (layer 1
// then 0).
inline constexpr int64_t kT = 40, kChunk = 8, kSpans = 3, kTasks = 20;
inline constexpr uint64_t kMaxResultBytes = 16 << 10;  // the largest tiny result is about 3 KiB

inline MambaConfig TinyConfig() { return adjsh::testing::SmallConfig(2, 8, 4, 4, 2, 11); }

inline TaskServiceOptions DefaultOptions() {
  TaskServiceOptions o;
  o.lease = absl::Seconds(60);  // nothing expires unless a test says so
  o.retry_after_ms = 5;
  o.max_result_bytes = kMaxResultBytes;
  return o;
}

// Bitwise equality of the loss and of every gradient tensor.
inline ::testing::AssertionResult SameBits(const GradResult<float>& a, const GradResult<float>& b) {
  if (std::memcmp(&a.loss, &b.loss, sizeof(double)) != 0) {
    return ::testing::AssertionFailure() << "loss " << a.loss << " vs " << b.loss;
  }
  return adjsh::testing::BitwiseEqual(a.grad, b.grad);
}

// A result as pushed: tensors in stream order (PutSpanResult's map order, by name).
using Named = std::vector<std::pair<std::string, HostTensor>>;

inline v1::ResultChunk HeaderMsg(const std::string& worker, const std::string& task,
                                 const std::string& lease) {
  v1::ResultChunk m;
  m.mutable_header()->set_worker_id(worker);
  m.mutable_header()->set_task_id(task);
  m.mutable_header()->set_lease_id(lease);
  return m;
}

inline void AppendTensor(std::vector<v1::ResultChunk>& msgs, const std::string& name,
                         const HostTensor& t, size_t piece = kDefaultPieceBytes) {
  for (const v1::TensorChunk& c : SplitTensor(name, t, piece)) {
    v1::ResultChunk m;
    *m.mutable_tensor() = c;
    msgs.push_back(std::move(m));
  }
}

inline std::vector<v1::ResultChunk> Messages(const std::optional<v1::ResultChunk>& header,
                                             const Named& tensors) {
  std::vector<v1::ResultChunk> msgs;
  if (header) msgs.push_back(*header);
  for (const auto& [name, t] : tensors) AppendTensor(msgs, name, t);
  return msgs;
}

inline HostTensor& Find(Named& named, const std::string& name) {
  for (auto& [n, t] : named)
    if (n == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  static HostTensor none;
  return none;
}

inline void Erase(Named& named, const std::string& name) {
  named.erase(std::remove_if(named.begin(), named.end(),
                             [&](const auto& p) { return p.first == name; }),
              named.end());
}

inline bool IsBackward(const v1::Task& t) {
  return t.kind() == v1::Task::SPAN_BACKWARD_SUMMARY || t.kind() == v1::Task::SPAN_BACKWARD;
}

struct PushOutcome {
  absl::Status status;
  v1::PushResultResponse response;
};

// One FetchInputs a fake worker made, and the names it got.
struct FetchRecord {
  std::string task_id;
  bool include_params = false, include_span = false;
  std::vector<std::string> names;
};

// What a fake well-behaved worker keeps between tasks (as worker/span_store.h does): the model
// of one params_version on its own CPU backend, that version's plan, and the spans it was
// handed. Members in dependency order: spans point into the model and the plan, the model into
// the parameters and the backend.
struct FakeWorker {
  std::unique_ptr<Backend<float>> backend;
  uint64_t version = 0;
  std::unique_ptr<MambaConfig> config;
  std::unique_ptr<ModelParams<float>> params;
  std::unique_ptr<LayerModel<ModelParams<float>>> model;
  std::map<int64_t, std::unique_ptr<SpanPlan>> plans;  // by sequence of the step
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<SpanWork<float>>> spans;  // (b, s)
  std::vector<FetchRecord> fetches;
  std::vector<int64_t> rebuilt_spans;  // spans rebuilt with a non-empty replay, in order
};

class TaskServiceWireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    params_ = InitParams<float>(TinyConfig(), 1234);
    tokens_.resize(kT);
    for (int64_t t = 0; t < kT; ++t) tokens_[t] = static_cast<uint32_t>((t * 7 + 3) % 11);
    grad_opt_.chunk = kChunk;
    grad_opt_.spans = kSpans;
    // The reference first (this also makes BLAS single-threaded for the whole process): the
    // in-process span schedule (engine/span_step.cc) with the same chunk and spans.
    absl::StatusOr<GradResult<float>> ref = ComputeGradient<float>(params_, tokens_, grad_opt_);
    ASSERT_TRUE(ref.ok()) << ref.status();
    reference_ = std::move(*ref);
    const MambaConfig c = TinyConfig();
    absl::StatusOr<SpanPlan> plan =
        SpanPlan::Make(kT, kChunk, kSpans, c.num_hidden_layers, c.conv_kernel);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = std::make_unique<SpanPlan>(*std::move(plan));
    ASSERT_EQ(plan_->num_tasks(), kTasks);
  }

  void TearDown() override {
    if (grad_thread_.joinable()) {
      // Cancel until the gradient thread ends (a cancel before the step starts has no effect).
      while (!WaitGradient(milliseconds(100))) service_->CancelCurrent();
    }
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  void Start(TaskServiceOptions options = DefaultOptions()) {
    service_ = std::make_unique<TaskServiceImpl>(options);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    stub_ = v1::TaskService::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                                         grpc::InsecureChannelCredentials()));
  }

  // ComputeGradient(params, tokens, {chunk 8, spans 3}, "job", 0) on a background thread.
  void StartGradient(GradOptions opt) {
    if (grad_thread_.joinable()) grad_thread_.join();
    {
      std::lock_guard<std::mutex> lock(grad_mu_);
      grad_result_.reset();
    }
    grad_thread_ = std::thread([this, opt] {
      absl::StatusOr<GradResult<float>> r =
          service_->ComputeGradient(params_, tokens_, opt, "job", 0);
      std::lock_guard<std::mutex> lock(grad_mu_);
      grad_result_ = std::move(r);
      grad_cv_.notify_all();
    });
  }
  void StartGradient() { StartGradient(grad_opt_); }

  // True once ComputeGradient has returned (its thread is then joined).
  bool WaitGradient(milliseconds timeout) {
    std::unique_lock<std::mutex> lock(grad_mu_);
    if (!grad_cv_.wait_for(lock, timeout, [&] { return grad_result_.has_value(); })) return false;
    lock.unlock();
    if (grad_thread_.joinable()) grad_thread_.join();
    return true;
  }
  bool GradientDone() {
    std::lock_guard<std::mutex> lock(grad_mu_);
    return grad_result_.has_value();
  }
  absl::StatusOr<GradResult<float>> GradientResult() {
    std::lock_guard<std::mutex> lock(grad_mu_);
    return *grad_result_;
  }

  static void Deadline(grpc::ClientContext& ctx) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }

  std::string Register(const std::string& name) {
    grpc::ClientContext ctx;
    Deadline(ctx);
    v1::RegisterWorkerRequest req;
    req.set_worker_name(name);
    v1::RegisterWorkerResponse resp;
    const absl::Status s = FromGrpcStatus(stub_->RegisterWorker(&ctx, req, &resp));
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_FALSE(resp.worker_id().empty());
    return resp.worker_id();
  }

  // skipped: tasks the worker says it skipped (PullTaskRequest.skipped), with why.
  absl::StatusOr<v1::PullTaskResponse> Pull(const std::string& worker,
                                            const std::vector<v1::Task>& skipped = {}) {
    grpc::ClientContext ctx;
    Deadline(ctx);
    v1::PullTaskRequest req;
    req.set_worker_id(worker);
    for (const v1::Task& t : skipped) {
      v1::SkippedTask* s = req.add_skipped();
      s->set_task_id(t.task_id());
      s->set_lease_id(t.lease_id());
      s->set_reason("state_size 64 is over this backend's 32");
    }
    v1::PullTaskResponse resp;
    absl::Status s = FromGrpcStatus(stub_->PullTask(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }

  // Pulls until a task comes (the step is published once ComputeGradient has made its plan).
  v1::Task PullTaskWait(const std::string& worker) {
    const auto until = SteadyClock::now() + std::chrono::seconds(20);
    while (SteadyClock::now() < until) {
      absl::StatusOr<v1::PullTaskResponse> r = Pull(worker);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      if (r->has_task()) return r->task();
      std::this_thread::sleep_for(milliseconds(2));
    }
    ADD_FAILURE() << "no task handed out to " << worker;
    return v1::Task();
  }

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& worker,
                                                  const std::vector<std::string>& tasks) {
    grpc::ClientContext ctx;
    Deadline(ctx);
    v1::HeartbeatRequest req;
    req.set_worker_id(worker);
    for (const std::string& t : tasks) req.add_task_ids(t);
    v1::HeartbeatResponse resp;
    absl::Status s = FromGrpcStatus(stub_->Heartbeat(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }

  static bool Lists(const v1::HeartbeatResponse& r, const std::string& task) {
    return std::find(r.cancelled_task_ids().begin(), r.cancelled_task_ids().end(), task) !=
           r.cancelled_task_ids().end();
  }

  absl::StatusOr<TensorMap> Fetch(const std::string& worker, const std::string& task,
                                  const std::string& lease, bool include_params = false,
                                  bool include_span = false) {
    grpc::ClientContext ctx;
    Deadline(ctx);
    v1::FetchInputsRequest req;
    req.set_worker_id(worker);
    req.set_task_id(task);
    req.set_lease_id(lease);
    req.set_include_params(include_params);
    req.set_include_span(include_span);
    std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader = stub_->FetchInputs(&ctx, req);
    TensorAssembler assembler;
    TensorMap got;
    absl::Status stream_error;
    v1::TensorChunk chunk;
    while (reader->Read(&chunk)) {
      absl::StatusOr<std::optional<NamedTensor>> done = assembler.Add(chunk);
      if (!done.ok()) {
        stream_error = done.status();
        ctx.TryCancel();
        break;
      }
      if (done->has_value()) got.emplace((*done)->name, std::move((*done)->tensor));
    }
    const absl::Status s = FromGrpcStatus(reader->Finish());
    if (!stream_error.ok()) return absl::InternalError(absl::StrCat("bad stream: ", stream_error.ToString()));
    if (!s.ok()) return s;
    if (absl::Status f = assembler.Finish(); !f.ok()) return f;
    return got;
  }

  PushOutcome Push(const std::vector<v1::ResultChunk>& msgs) {
    grpc::ClientContext ctx;
    Deadline(ctx);
    PushOutcome out;
    std::unique_ptr<grpc::ClientWriter<v1::ResultChunk>> writer =
        stub_->PushResult(&ctx, &out.response);
    for (const v1::ResultChunk& m : msgs) {
      if (!writer->Write(m)) break;  // the server may already have ended the call
    }
    writer->WritesDone();
    out.status = FromGrpcStatus(writer->Finish());
    return out;
  }

  // The fake worker state of `worker` (made on first use; safe from several threads, each
  // using its own worker).
  FakeWorker& Fake(const std::string& worker) {
    std::lock_guard<std::mutex> lock(fakes_mu_);
    std::unique_ptr<FakeWorker>& fw = fakes_[worker];
    if (fw == nullptr) fw = std::make_unique<FakeWorker>();
    return *fw;
  }

  // The well-behaved worker's side of one task, as worker/task_runner.cc does it: fetch the
  // inputs (with the model when it holds no model of the task's params_version; with the span's
  // tokens and replay when it holds no span, or one not Ready for the task), rebuild the span
  // by replaying ReplayIds if so, run the task and return PutSpanResult's tensors. An error
  // from FetchInputs (a lost lease) is returned as is; anything else wrong fails the test.
  absl::StatusOr<Named> TryWork(const std::string& worker, const v1::Task& task) {
    FakeWorker& fw = Fake(worker);
    const std::optional<SpanPhase> phase = PhaseOf(task.kind());
    EXPECT_TRUE(phase.has_value()) << v1::Task::Kind_Name(task.kind());
    if (!phase) return absl::InvalidArgumentError("not a span task");
    if (fw.backend == nullptr) {
      absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(Device{});
      EXPECT_TRUE(backend.ok()) << backend.status();
      if (!backend.ok()) return backend.status();
      fw.backend = *std::move(backend);
    }
    if (fw.config == nullptr || fw.version != task.params_version()) {  // a new step
      absl::StatusOr<MambaConfig> config = ParseConfigJson(task.config_json());
      EXPECT_TRUE(config.ok()) << config.status();
      if (!config.ok()) return config.status();
      fw.spans.clear();  // before the model and plans they point into
      fw.plans.clear();
      fw.model.reset();
      fw.params.reset();
      fw.config = std::make_unique<MambaConfig>(*config);
      fw.version = task.params_version();
    }
    const MambaConfig& c = *fw.config;
    std::unique_ptr<SpanPlan>& seq_plan = fw.plans[task.sequence()];
    if (seq_plan == nullptr) {  // each sequence of the step has a plan of its own
      absl::StatusOr<SpanPlan> plan = SpanPlan::Make(task.context_length(), task.chunk(),
                                                     task.spans(), c.num_hidden_layers,
                                                     c.conv_kernel, task.forward_only());
      EXPECT_TRUE(plan.ok()) << plan.status();
      if (!plan.ok()) return plan.status();
      seq_plan = std::make_unique<SpanPlan>(*std::move(plan));
    }
    const SpanPlan& plan = *seq_plan;
    const std::pair<int64_t, int64_t> key{task.sequence(), task.span()};
    const SpanTask span_task{*phase, task.layer(), task.span()};
    const int64_t id = plan.Id(span_task.phase, span_task.layer, span_task.span);
    EXPECT_GE(id, 0);
    if (id < 0) return absl::InvalidArgumentError("no such task in the plan");
    const auto held = fw.spans.find(key);
    const bool include_params = fw.model == nullptr;
    const bool include_span = held == fw.spans.end() || !held->second->Ready(span_task);

    absl::StatusOr<TensorMap> fetched =
        Fetch(worker, task.task_id(), task.lease_id(), include_params, include_span);
    if (!fetched.ok()) return fetched.status();
    TensorMap& got = *fetched;
    FetchRecord record{task.task_id(), include_params, include_span, {}};
    for (const auto& [name, t] : got) record.names.push_back(name);
    fw.fetches.push_back(std::move(record));

    if (include_params) {  // every "backbone.*" tensor is a parameter; inputs have other names
      TensorMap named;
      for (auto it = got.begin(); it != got.end();) {
        if (it->first.starts_with("backbone.")) {
          named.insert(got.extract(it++));
        } else {
          ++it;
        }
      }
      absl::StatusOr<ModelParams<float>> p = ParamsFromTensors<float>(c, named);
      EXPECT_TRUE(p.ok()) << p.status();
      if (!p.ok()) return p.status();
      fw.params = std::make_unique<ModelParams<float>>(*std::move(p));
      fw.model = std::make_unique<LayerModel<ModelParams<float>>>(
          MakeLayerModel(*fw.params, *fw.backend));
    }
    double rebuild_s = 0;
    if (include_span) {  // a fresh span, replayed up to this task
      const auto started = SteadyClock::now();
      std::vector<uint32_t> toks;
      std::vector<uint8_t> mask;
      const absl::Status st = TakeSpanStart(c, plan, task.span(), task.masked(), got, toks, mask);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) return st;
      auto work = std::make_unique<SpanWork<float>>(
          *fw.model, plan, task.span(), std::move(toks), std::move(mask), task.targets(),
          task.storage() == "bf16" ? Storage::kBF16 : Storage::kCompute, "");
      const std::vector<int64_t> replay = plan.ReplayIds(id);
      for (int64_t r : replay) {
        absl::StatusOr<SpanInputs<float>> in =
            TakeSpanInputs<float>(c, plan, plan.task(r), ReplayPrefix(plan.task(r)), got);
        EXPECT_TRUE(in.ok()) << in.status();
        if (!in.ok()) return in.status();
        SpanOutputs<float> discard;
        const absl::Status run = work->Run(plan.task(r), *in, discard);
        EXPECT_TRUE(run.ok()) << run;
        if (!run.ok()) return run;
      }
      fw.spans[key] = std::move(work);
      // A span's first task makes it from its tokens: that is no rebuild (task_runner.cc).
      if (!replay.empty()) {
        rebuild_s = std::max(
            std::chrono::duration<double>(SteadyClock::now() - started).count(), 1e-9);
        fw.rebuilt_spans.push_back(task.span());
      }
    }
    absl::StatusOr<SpanInputs<float>> in = TakeSpanInputs<float>(c, plan, span_task, "", got);
    EXPECT_TRUE(in.ok()) << in.status();
    if (!in.ok()) return in.status();
    EXPECT_TRUE(got.empty()) << "unexpected input \"" << got.begin()->first << "\"";
    SpanResult<float> result;
    const auto computing = SteadyClock::now();
    const absl::Status run = fw.spans.at(key)->Run(span_task, *in, result.out);
    EXPECT_TRUE(run.ok()) << run;
    if (!run.ok()) return run;
    result.compute_seconds =
        std::chrono::duration<double>(SteadyClock::now() - computing).count();
    result.rebuild_seconds = rebuild_s;
    // The span's last task: its rows are of no more use.
    if (span_task.phase == SpanPhase::kBackward && span_task.layer == 0)
      fw.spans.erase(key);
    const TensorMap out = PutSpanResult<float>(c, plan, span_task, result);
    return Named(out.begin(), out.end());
  }

  // TryWork, which must succeed.
  Named Work(const std::string& worker, const v1::Task& task) {
    absl::StatusOr<Named> r = TryWork(worker, task);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : Named();
  }

  v1::ResultChunk Header(const std::string& worker, const v1::Task& task) {
    return HeaderMsg(worker, task.task_id(), task.lease_id());
  }

  // Pulls and works tasks with `worker`, pushing each (which must be accepted), until it is
  // handed one that `stop` accepts: that one is returned leased and not worked.
  v1::Task RunUntil(const std::string& worker, const std::function<bool(const v1::Task&)>& stop) {
    for (int i = 0; i <= kTasks; ++i) {
      const v1::Task t = PullTaskWait(worker);
      if (t.task_id().empty() || stop(t)) return t;
      const PushOutcome p = Push(Messages(Header(worker, t), Work(worker, t)));
      EXPECT_TRUE(p.status.ok()) << p.status;
      EXPECT_TRUE(p.response.accepted()) << p.response.reason();
    }
    ADD_FAILURE() << "no task for which the predicate holds";
    return v1::Task();
  }

  // Well-behaved workers, taking turns: each pulls, works and pushes until ComputeGradient
  // returns (tolerating lost leases: a task whose lease is lost is pulled again later). Every
  // registered worker that is heard from must be among them: the service hands a live worker's
  // spans to nobody else (coordinator/span_scheduler.h).
  void CompleteAll(const std::vector<std::string>& workers) {
    const auto until = SteadyClock::now() + std::chrono::seconds(60);
    while (!WaitGradient(milliseconds(0))) {
      ASSERT_LT(SteadyClock::now(), until) << "the gradient did not finish";
      bool any = false;
      for (const std::string& worker : workers) {
        absl::StatusOr<v1::PullTaskResponse> r = Pull(worker);
        ASSERT_TRUE(r.ok()) << r.status();
        if (!r->has_task()) continue;
        any = true;
        const v1::Task& task = r->task();
        absl::StatusOr<Named> result = TryWork(worker, task);
        if (!result.ok()) {
          ASSERT_TRUE(absl::IsFailedPrecondition(result.status())) << result.status();
          continue;
        }
        const PushOutcome p = Push(Messages(Header(worker, task), *result));
        ASSERT_TRUE(p.status.ok()) << p.status;
      }
      if (!any) std::this_thread::sleep_for(milliseconds(2));
    }
  }
  void CompleteAll(const std::string& worker) { CompleteAll(std::vector<std::string>{worker}); }

  // Completes every task with `workers` and checks the gradient against the in-process one.
  void FinishAndCheckWith(const std::vector<std::string>& workers) {
    CompleteAll(workers);
    ASSERT_TRUE(WaitGradient(std::chrono::seconds(10)));
    absl::StatusOr<GradResult<float>> got = GradientResult();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(SameBits(*got, reference_));
  }
  void FinishAndCheck(const std::string& worker) {
    FinishAndCheckWith(std::vector<std::string>{worker});
  }

  ModelParams<float> params_;
  std::vector<uint32_t> tokens_;
  GradOptions grad_opt_;
  GradResult<float> reference_;
  std::unique_ptr<SpanPlan> plan_;  // the step's plan, as the service makes it

  std::unique_ptr<TaskServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<v1::TaskService::Stub> stub_;

  std::mutex fakes_mu_;
  std::map<std::string, std::unique_ptr<FakeWorker>> fakes_;

  std::thread grad_thread_;
  std::mutex grad_mu_;
  std::condition_variable grad_cv_;
  std::optional<absl::StatusOr<GradResult<float>>> grad_result_;
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_TESTS_COORDINATOR_TASK_SERVICE_FIXTURE_H_
