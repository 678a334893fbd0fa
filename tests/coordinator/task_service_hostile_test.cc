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

}  // namespace
}  // namespace adjsh::coordinator
