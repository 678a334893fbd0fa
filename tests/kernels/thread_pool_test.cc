// common/thread_pool.h: ParallelFor runs every index once, loop after loop on one pool, and
// RunDag starts a task only after its predecessors.
#include "common/thread_pool.h"

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

// On one thread the order is the schedule: ready tasks by rank, lowest first, and in the order
// they became ready among equal ranks (and with no rank at all).
TEST(ThreadPoolTest, RunDagTakesReadyTasksByRankThenReadiness) {
  ThreadPool pool(1);
  // Task 0 readies 1..6 at once (in that order), and 6 readies 7.
  auto successors = [](int64_t t) {
    if (t == 0) return std::vector<int64_t>{1, 2, 3, 4, 5, 6};
    if (t == 6) return std::vector<int64_t>{7};
    return std::vector<int64_t>{};
  };
  std::vector<int64_t> order;
  RunDag(pool, 8, successors, [&](int64_t t) { order.push_back(t); });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  order.clear();
  // Odd tasks rank 1, even ones 0: 2, 4 and 6 first; 7, readied by 6, still after 1, 3 and 5.
  RunDag(pool, 8, successors, [&](int64_t t) { order.push_back(t); },
         [](int64_t t) { return t % 2; });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 2, 4, 6, 1, 3, 5, 7}));
}

}  // namespace
}  // namespace adjsh
