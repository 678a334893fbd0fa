// The TaskService against workers that send bad numbers or pose as others
// (task_service_fixture.h: real gRPC on 127.0.0.1, a gradient in flight). Each test guards a
// defect found by adversarial testing: every one failed on the service before its fix.
#include <cmath>
#include <limits>
#include <set>

#include "tests/coordinator/task_service_fixture.h"

namespace adjsh::coordinator {
namespace {

using Hostile = TaskServiceWireTest;

// Puts `value` into element 0 of tensor `name` of a computed result.
void Poison(Named& result, const std::string& name, float value) {
  HostTensor& t = Find(result, name);
  std::memcpy(t.data.data(), &value, sizeof(float));
}

// A NaN or Inf anywhere in a result is refused on arrival with the reason, nothing of it is
// applied, and the task is handed out again (the gradient ends bitwise the in-process one).
// A worker that sends 3 such results gets no more tasks; the count is the service's metric.
TEST_F(Hostile, NonFiniteResultsAreRefusedRetriedAndTheSenderShunned) {
  Start();
  StartGradient();
  const std::string bad = Register("bad"), good = Register("good");
  const std::vector<std::pair<std::string, float>> poisons = {
      {"du", std::numeric_limits<float>::quiet_NaN()},
      {"mu_out", std::numeric_limits<float>::infinity()},
      {"backbone.layers.1.mixer.in_proj.weight", -std::numeric_limits<float>::infinity()}};
  for (size_t q = 0; q < poisons.size(); ++q) {
    const v1::Task t = PullTaskWait(bad);
    ASSERT_EQ(t.task_id(), "1:0") << "the refused task must come back first";
    Named result = Work(bad, t);
    Poison(result, poisons[q].first, poisons[q].second);
    const PushOutcome p = Push(Messages(Header(bad, t), result));
    ASSERT_TRUE(p.status.ok()) << p.status;
    EXPECT_FALSE(p.response.accepted());
    EXPECT_NE(p.response.reason().find("non-finite value (" + poisons[q].first + "[0]"),
              std::string::npos)
        << p.response.reason();
    EXPECT_NE(p.response.reason().find("handed out again"), std::string::npos);
    EXPECT_EQ(service_->results_nonfinite(), static_cast<int64_t>(q + 1));
  }
  absl::StatusOr<v1::PullTaskResponse> shunned = Pull(bad);
  EXPECT_TRUE(StatusIs(shunned, absl::StatusCode::kPermissionDenied, "non-finite"));
  FinishAndCheck(good);
  EXPECT_EQ(service_->results_accepted(), kTasks);
}

// A result stream of many empty tensors with long unique names: refused at the first tensor past
// the expected count (RESOURCE_EXHAUSTED), so the coordinator holds no more than a real result.
TEST_F(Hostile, AResultOfManyTensorsIsRefusedAtTheFirstExtraOne) {
  Start();
  StartGradient();
  const std::string w = Register("w");
  const v1::Task t = PullTaskWait(w);
  Named junk;
  for (int i = 0; i < 2000; ++i) {
    junk.emplace_back(absl::StrCat(std::string(1000, 'n'), i),
                      HostTensor::From<float>(std::vector<float>(), {0}, DType::kF32));
  }
  const PushOutcome p = Push(Messages(Header(w, t), junk));
  EXPECT_TRUE(StatusIs(p.status, absl::StatusCode::kResourceExhausted, "over the limit of"));
  // The worker still holds its lease and sends the real result; nothing of the junk was kept.
  const PushOutcome real = Push(Messages(Header(w, t), Work(w, t)));
  ASSERT_TRUE(real.status.ok()) << real.status;
  EXPECT_TRUE(real.response.accepted());
  FinishAndCheck(w);
}

// Worker names are bounded; workers unheard of for reap_after are forgotten, and registrations
// past max_workers are refused, so RegisterWorker calls cannot grow the coordinator without end.
TEST_F(Hostile, WorkerRegistrationsAreBoundedAndDeadWorkersReaped) {
  TaskServiceOptions o = DefaultOptions();
  o.lease = absl::Milliseconds(10);
  o.reap_after = absl::Milliseconds(50);
  o.max_workers = 3;
  Start(o);
  grpc::ClientContext ctx;
  Deadline(ctx);
  v1::RegisterWorkerRequest req;
  req.set_worker_name(std::string(1 << 20, 'x'));  // under gRPC's own 4 MiB default
  v1::RegisterWorkerResponse resp;
  EXPECT_TRUE(StatusIs(FromGrpcStatus(stub_->RegisterWorker(&ctx, req, &resp)),
                       absl::StatusCode::kInvalidArgument, "worker_name"));
  for (int i = 0; i < 3; ++i) Register(absl::StrCat("w", i));
  {
    grpc::ClientContext c2;
    Deadline(c2);
    req.set_worker_name("one too many");
    EXPECT_TRUE(StatusIs(FromGrpcStatus(stub_->RegisterWorker(&c2, req, &resp)),
                         absl::StatusCode::kResourceExhausted, "its limit"));
  }
  EXPECT_EQ(service_->registered_workers(), 3);
  std::this_thread::sleep_for(milliseconds(120));  // all three go silent
  const std::string alive = Register("alive");
  EXPECT_EQ(service_->registered_workers(), 1);
  EXPECT_TRUE(Pull(alive).ok());
}

}  // namespace
}  // namespace adjsh::coordinator
