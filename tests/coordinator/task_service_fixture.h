// The TaskService over real gRPC (127.0.0.1, a selected port) with a gradient in flight, for
// tests that act as workers through a stub: TaskServiceWireTest starts the service, runs
// TaskServiceImpl::ComputeGradient for a tiny model on a background thread, and gives the
// calls a worker makes (register, pull, heartbeat, fetch, compute, push) and a well-behaved
// worker that completes every task. Included by task_service_test.cc and
// task_service_hostile_test.cc (one test binary each).
#ifndef ADJSH_TESTS_COORDINATOR_TASK_SERVICE_FIXTURE_H_
#define ADJSH_TESTS_COORDINATOR_TASK_SERVICE_FIXTURE_H_

#include <algorithm>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstring>
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
#include "engine/backward_task.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/cpu/mamba_block.h"
#include "proto/adjsh.grpc.pb.h"
#include "proto/status_util.h"
#include "proto/tensor_codec.h"
#include "tests/common/test_util.h"
#include "tests/kernels/test_util.h"

namespace adjsh::coordinator {

using ::adjsh::testing::StatusIs;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// D=8, K=2, N=4, V=11, T=40, C=16: 3 chunks x 2 layers = 6 backward tasks.
inline constexpr int64_t kT = 40, kChunk = 16, kTasks = 6;
inline constexpr uint64_t kMaxResultBytes = 16 << 10;  // a tiny model's result is about 4 KiB

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

// A result as pushed: tensors in the documented order.
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

struct PushOutcome {
  absl::Status status;
  v1::PushResultResponse response;
};

class TaskServiceWireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    params_ = InitParams<float>(TinyConfig(), 1234);
    tokens_.resize(kT);
    for (int64_t t = 0; t < kT; ++t) tokens_[t] = static_cast<uint32_t>((t * 7 + 3) % 11);
    grad_opt_.chunk = kChunk;
    // The reference first (this also makes BLAS single-threaded for the whole process).
    absl::StatusOr<GradResult<float>> ref = ComputeGradient<float>(params_, tokens_, grad_opt_);
    ASSERT_TRUE(ref.ok()) << ref.status();
    reference_ = std::move(*ref);
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

  // ComputeGradient(params, tokens, {chunk 16}, "job", 0) on a background thread.
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

  absl::StatusOr<v1::PullTaskResponse> Pull(const std::string& worker) {
    grpc::ClientContext ctx;
    Deadline(ctx);
    v1::PullTaskRequest req;
    req.set_worker_id(worker);
    v1::PullTaskResponse resp;
    absl::Status s = FromGrpcStatus(stub_->PullTask(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }

  // Pulls until a task comes (the step is published once its forward is done).
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
                                  const std::string& lease, bool include_params = true) {
    grpc::ClientContext ctx;
    Deadline(ctx);
    v1::FetchInputsRequest req;
    req.set_worker_id(worker);
    req.set_task_id(task);
    req.set_lease_id(lease);
    req.set_include_params(include_params);
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

  // The worker's computation on fetched tensors: a block built from the received parameters,
  // RunBackwardTask, the outputs under the contract's names, in its order.
  Named Compute(const v1::Task& task, const TensorMap& got) {
    absl::StatusOr<MambaConfig> config = ParseConfigJson(task.config_json());
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return {};
    const MambaConfig& c = *config;
    const int64_t k = task.layer(), D = c.hidden_size, Di = c.inner(), N = c.state_size;
    auto floats = [&](const std::string& name) {
      auto it = got.find(name);
      EXPECT_NE(it, got.end()) << "inputs lack " << name;
      if (it == got.end()) return std::vector<float>();
      absl::StatusOr<std::vector<float>> v = it->second.To<float>();
      EXPECT_TRUE(v.ok()) << v.status();
      return v.ok() ? *v : std::vector<float>();
    };
    LayerParams<float> layer;
    for (const LayerParamSlot<float>& slot : LayerParamSlots<float>()) {
      layer.*slot.member = floats(LayerParamName(k, slot.suffix));
    }
    const cpu::MambaBlockCpu<float> block(c, layer);
    BackwardTaskInputs<float> in;
    in.layer = k;
    in.chunk = task.chunk();
    in.rows = {task.halo(), task.len(), 0};
    in.u = floats("u");
    in.g = floats("g");
    in.h0 = floats("h0");
    if (got.contains("mu")) in.mu = floats("mu");
    BackwardTaskOutputs<float> out;
    RunBackwardTask(block, c, in, out);
    Named r;
    for (const LayerParamSlot<float>& slot : LayerParamSlots<float>()) {
      r.emplace_back(LayerParamName(k, slot.suffix),
                     HostTensor::From<float>(out.grad.*slot.member, slot.shape(c), DType::kF32));
    }
    r.emplace_back("du", HostTensor::From<float>(out.du, {task.len(), D}, DType::kF32));
    r.emplace_back("du_halo", HostTensor::From<float>(out.du_halo, {task.halo(), D}, DType::kF32));
    r.emplace_back("mu_out", HostTensor::From<float>(out.mu_out, {Di, N}, DType::kF32));
    return r;
  }

  // Fetch (with parameters) and compute, as a well-behaved worker does.
  Named Work(const std::string& worker, const v1::Task& task) {
    absl::StatusOr<TensorMap> got = Fetch(worker, task.task_id(), task.lease_id());
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return {};
    return Compute(task, *got);
  }

  v1::ResultChunk Header(const std::string& worker, const v1::Task& task) {
    return HeaderMsg(worker, task.task_id(), task.lease_id());
  }

  // The well-behaved worker: pulls, fetches, computes and pushes until ComputeGradient returns
  // (tolerating lost leases: a task whose lease is lost is pulled again later).
  void CompleteAll(const std::string& worker) {
    const auto until = SteadyClock::now() + std::chrono::seconds(60);
    while (!WaitGradient(milliseconds(0))) {
      ASSERT_LT(SteadyClock::now(), until) << "the gradient did not finish";
      absl::StatusOr<v1::PullTaskResponse> r = Pull(worker);
      ASSERT_TRUE(r.ok()) << r.status();
      if (!r->has_task()) {
        std::this_thread::sleep_for(milliseconds(2));
        continue;
      }
      const v1::Task& task = r->task();
      absl::StatusOr<TensorMap> got = Fetch(worker, task.task_id(), task.lease_id());
      if (!got.ok()) {
        ASSERT_TRUE(absl::IsFailedPrecondition(got.status())) << got.status();
        continue;
      }
      const PushOutcome p = Push(Messages(Header(worker, task), Compute(task, *got)));
      ASSERT_TRUE(p.status.ok()) << p.status;
    }
  }

  // Completes every task with `worker` and checks the gradient against the in-process one.
  void FinishAndCheck(const std::string& worker) {
    CompleteAll(worker);
    ASSERT_TRUE(WaitGradient(std::chrono::seconds(10)));
    absl::StatusOr<GradResult<float>> got = GradientResult();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(SameBits(*got, reference_));
  }

  ModelParams<float> params_;
  std::vector<uint32_t> tokens_;
  GradOptions grad_opt_;
  GradResult<float> reference_;

  std::unique_ptr<TaskServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<v1::TaskService::Stub> stub_;

  std::thread grad_thread_;
  std::mutex grad_mu_;
  std::condition_variable grad_cv_;
  std::optional<absl::StatusOr<GradResult<float>>> grad_result_;
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_TESTS_COORDINATOR_TASK_SERVICE_FIXTURE_H_
