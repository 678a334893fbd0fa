// How long a step's coordinator waits for the worker tree's roots after the step's last task
// (TaskServiceImpl::RootsDeadline) before it begins the step again through the coordinator.
#include <gtest/gtest.h>

#include "absl/time/time.h"
#include "common/model.h"
#include "coordinator/task_service.h"

namespace adjsh::coordinator {
namespace {

using Impl = TaskServiceImpl;

// A small model: the leases alone (its sums climb the tree in well under a second).
TEST(RootsDeadline, IsFourLeasesForASmallModel) {
  const absl::Duration d = Impl::RootsDeadline(absl::Seconds(5), 8 << 20, 2);
  EXPECT_GE(d, absl::Seconds(20));
  EXPECT_LT(d, absl::Seconds(21));
}

// The sums are the model's size, sent once per level of the tree at the slow rate: a 130M
// model (520 MB in f32) over 32 workers (6 levels) gets about 31 s more than the leases; a
// 1.4 GB one about 84 s. More workers, more levels; a longer lease, more time.
TEST(RootsDeadline, GrowsWithTheModelTheTreeAndTheLease) {
  const absl::Duration lease = absl::Seconds(5);
  const uint64_t m130 = 520'000'000, m1400 = 1'400'000'000;
  const absl::Duration extra130 = Impl::RootsDeadline(lease, m130, 32) - 4 * lease;
  EXPECT_NEAR(absl::ToDoubleSeconds(extra130), 6 * 5.2, 1e-6);
  EXPECT_NEAR(absl::ToDoubleSeconds(Impl::RootsDeadline(lease, m1400, 32) - 4 * lease), 84.0,
              1e-6);
  EXPECT_GT(Impl::RootsDeadline(lease, m130, 33), Impl::RootsDeadline(lease, m130, 32));
  EXPECT_GT(Impl::RootsDeadline(absl::Seconds(10), m130, 32),
            Impl::RootsDeadline(lease, m130, 32));
  // One worker: one level (its own sums to the coordinator).
  EXPECT_NEAR(absl::ToDoubleSeconds(Impl::RootsDeadline(lease, m130, 1) - 4 * lease), 5.2, 1e-6);
}

}  // namespace
}  // namespace adjsh::coordinator
