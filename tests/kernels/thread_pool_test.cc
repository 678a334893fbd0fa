// engine/thread_pool.h: ParallelFor runs every index once, loop after loop on one pool, and
// RunDag starts a task only after its predecessors.
#include "engine/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace adjsh {
namespace {

TEST(ThreadPoolTest, ParallelForRunsEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(1000);
    for (int round = 0; round < 3; ++round)  // a pool runs many loops
      pool.ParallelFor(1000, [&](int64_t i) { ++hits[i]; });
    for (auto& h : hits) ASSERT_EQ(h.load(), 3) << threads;
  }
}

TEST(ThreadPoolTest, RunDagStartsATaskAfterItsPredecessors) {
  ThreadPool pool(3);
  // Task t's successors: t + 1 and t + 7 (a chain with shortcuts).
  const int64_t n = 60;
  std::vector<std::atomic<int>> done(n);
  std::atomic<int> violations{0};
  RunDag(
      pool, n,
      [&](int64_t t) {
        std::vector<int64_t> s;
        if (t + 1 < n) s.push_back(t + 1);
        if (t + 7 < n) s.push_back(t + 7);
        return s;
      },
      [&](int64_t t) {
        if ((t >= 1 && !done[t - 1]) || (t >= 7 && !done[t - 7])) ++violations;
        done[t] = 1;
      });
  EXPECT_EQ(violations.load(), 0);
  for (auto& d : done) EXPECT_EQ(d.load(), 1);
}

}  // namespace
}  // namespace adjsh
