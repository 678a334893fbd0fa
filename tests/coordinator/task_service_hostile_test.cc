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
  ASSERT_GE(t.data.size(), sizeof(float)) << name;
  std::memcpy(t.data.data(), &value, sizeof(float));
}

// A NaN or Inf anywhere in a result is refused on arrival with the reason, nothing of it is
// applied, and the task is handed out again (first: it is the lowest ready task of the
// sender's span). A worker that sends 3 such results gets no more tasks, and its spans go to
// the others, who rebuild them; the gradient ends bitwise the in-process one. The count is the
// service's metric.
TEST_F(Hostile, NonFiniteResultsAreRefusedRetriedAndTheSenderShunned) {
  Start();
  StartGradient();
  const std::string bad = Register("bad");  // alone at first: it owns every span it claims
  struct Poisoned {
    std::string tensor;  // the tensor poisoned
    float value;
    std::string label;  // how the refusal names it (engine/span_tensors.h FirstNonFinite)
  };
  auto refuse = [&](const v1::Task& t, const Poisoned& q, int64_t count) {
    SCOPED_TRACE(q.tensor);
    Named result = Work(bad, t);
    Poison(result, q.tensor, q.value);
    const PushOutcome p = Push(Messages(Header(bad, t), result));
    ASSERT_TRUE(p.status.ok()) << p.status;
    EXPECT_FALSE(p.response.accepted());
    EXPECT_NE(p.response.reason().find("non-finite value (" + q.label + "[0]"),
              std::string::npos)
        << p.response.reason();
    EXPECT_NE(p.response.reason().find("handed out again"), std::string::npos);
    EXPECT_EQ(service_->results_nonfinite(), count);
  };

  // A forward summary: the span's end state.
  const v1::Task t0 = PullTaskWait(bad);
  ASSERT_EQ(t0.task_id(), "1:0");
  refuse(t0, {"h_end", std::numeric_limits<float>::quiet_NaN(), "h_end"}, 1);
  const v1::Task again = PullTaskWait(bad);
  ASSERT_EQ(again.task_id(), "1:0") << "the refused task must come back first";
  ASSERT_NE(again.lease_id(), t0.lease_id());
  PushOutcome p = Push(Messages(Header(bad, again), Work(bad, again)));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted()) << p.response.reason();

  // A backward (layer 1, span 2): its halo gradient, then a layer partial.
  const v1::Task back =
      RunUntil(bad, [](const v1::Task& t) { return t.kind() == v1::Task::SPAN_BACKWARD; });
  refuse(back, {"du_halo_prev", std::numeric_limits<float>::infinity(), "du_halo_prev"}, 2);
  const v1::Task back2 = PullTaskWait(bad);
  ASSERT_EQ(back2.task_id(), back.task_id()) << "the refused task must come back first";
  refuse(back2,
         {"backbone.layers.1.mixer.in_proj.weight", -std::numeric_limits<float>::infinity(),
          "mixer.in_proj.weight"},
         3);

  absl::StatusOr<v1::PullTaskResponse> shunned = Pull(bad);
  EXPECT_TRUE(StatusIs(shunned, absl::StatusCode::kPermissionDenied, "non-finite"));
  // Another worker takes over bad's spans (rebuilding them: bad is no longer live) and the
  // gradient is the in-process one.
  const std::string good = Register("good");
  FinishAndCheck(good);
  EXPECT_EQ(service_->results_accepted(), kTasks);
  EXPECT_EQ(service_->results_nonfinite(), 3);
  EXPECT_GT(service_->span_rebuilds(), 0);
  EXPECT_FALSE(Fake(good).rebuilt_spans.empty());
}

// A worker that cannot run its tasks (a state size its CUDA kernels do not take, say) skipped
// them without a word: each lease lapsed and the task went back to the span's owner, the same
// worker, for ever, and the job hung. It now says so on its next pull: the lease ends at once
// (a stale one is ignored), and after kShunAfterSkipped in a row it gets no task of the job
// (NoTask.reason says why) while another worker takes its spans; the gradient is the
// in-process one.
TEST_F(Hostile, AWorkerThatSkipsItsTasksGetsNoMoreOfTheJob) {
  Start();  // 60 s leases: only a skip ends one before the test does
  StartGradient();
  const std::string cant = Register("cant");
  const v1::Task t1 = PullTaskWait(cant);
  absl::StatusOr<v1::PullTaskResponse> r = Pull(cant, {t1});
  ASSERT_TRUE(r.ok() && r->has_task()) << r.status();
  const v1::Task t2 = r->task();
  EXPECT_EQ(t2.task_id(), t1.task_id()) << "its own span's task comes back to it";
  EXPECT_NE(t2.lease_id(), t1.lease_id());
  r = Pull(cant, {t1, t2});  // t1's lease is over: not counted again
  ASSERT_TRUE(r.ok() && r->has_task()) << r.status();
  EXPECT_EQ(service_->tasks_skipped(), 2);
  r = Pull(cant, {r->task()});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_no_task());
  EXPECT_NE(r->no_task().reason().find("skipped 3 tasks of job"), std::string::npos)
      << r->no_task().reason();
  EXPECT_NE(r->no_task().reason().find("state_size 64"), std::string::npos);
  EXPECT_EQ(service_->tasks_skipped(), 3);
  EXPECT_EQ(service_->worker_counts().live, 0);
  // What a local cluster, to which no other worker comes, ends its run with.
  EXPECT_NE(service_->ShunNote().find("worker cant skipped 3 tasks in a row (the last: task "),
            std::string::npos)
      << service_->ShunNote();
  const std::string good = Register("good");
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
