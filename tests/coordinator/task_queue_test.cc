// Tests for coordinator/task_queue: dependency order on the engine's wavefront grids, leases and
// their expiry with a fake clock (no sleeping), exactly-once results, and a concurrent stress run.
#include "coordinator/task_queue.h"

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace adjsh::coordinator {
namespace {

using absl::StatusCode;

// Succeeds when `status` has `code` and its message contains every one of `parts`.
::testing::AssertionResult StatusIs(const absl::Status& status, StatusCode code,
                                    std::initializer_list<std::string_view> parts = {}) {
  if (status.code() != code) {
    return ::testing::AssertionFailure()
           << "expected " << absl::StatusCodeToString(code) << ", got " << status;
  }
  const std::string message(status.message());
  for (std::string_view part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "\"" << message << "\" lacks \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}
template <typename T>
::testing::AssertionResult StatusIs(const absl::StatusOr<T>& s, StatusCode code,
                                    std::initializer_list<std::string_view> parts = {}) {
  return StatusIs(s.status(), code, parts);
}

// A thread-safe manual clock.
class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  TaskQueue::Clock AsClock() {
    return [this] { return Now(); };
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
};

constexpr absl::Duration kLease = absl::Seconds(10);

using Graph = std::map<int64_t, std::vector<int64_t>>;  // task id -> its dependencies

// A task is WAITING exactly while some dependency is not DONE.
void ExpectReadinessMatchesDependencies(const TaskQueue& q, const Graph& graph) {
  for (const auto& [id, deps] : graph) {
    bool met = true;
    for (int64_t d : deps) met = met && q.GetTask(d)->state == TaskState::kDone;
    EXPECT_EQ(q.GetTask(id)->state == TaskState::kWaiting, !met) << "task " << id;
  }
}

// Leases every READY task, then completes them one by one: one wavefront per call, ids in lease
// order. Readiness is checked after every single completion, not only between waves.
std::vector<int64_t> LeaseAndCompleteWave(TaskQueue& q, const Graph& graph) {
  std::vector<LeasedTask> leased;
  while (true) {
    auto r = q.Lease("w", kLease);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || !r->task) break;
    leased.push_back(*r->task);
  }
  std::vector<int64_t> ids;
  for (const LeasedTask& t : leased) {
    EXPECT_TRUE(q.Complete(t.task_id, t.lease_id).ok());
    ExpectReadinessMatchesDependencies(q, graph);
    ids.push_back(t.task_id);
  }
  return ids;
}

constexpr int64_t kK = 3, kC = 4;  // layers x chunks; task (k, c) has id k * kC + c
int64_t Id(int64_t k, int64_t c) { return k * kC + c; }

TEST(TaskQueueTest, ForwardWavefrontRunsAntiDiagonalsLowestIdFirst) {
  TaskQueue q;
  Graph graph;
  for (int64_t k = 0; k < kK; ++k) {
    for (int64_t c = 0; c < kC; ++c) {
      std::vector<int64_t> deps;  // forward (k, c) after (k-1, c) and (k, c-1)
      if (k > 0) deps.push_back(Id(k - 1, c));
      if (c > 0) deps.push_back(Id(k, c - 1));
      ASSERT_TRUE(q.AddTask(Id(k, c), "fwd", deps).ok());
      graph[Id(k, c)] = deps;
    }
  }
  EXPECT_EQ(q.Stats().ready, 1);
  EXPECT_EQ(q.Stats().waiting, kK * kC - 1);
  const std::vector<std::vector<int64_t>> expected = {{0},       {1, 4},  {2, 5, 8},
                                                      {3, 6, 9}, {7, 10}, {11}};
  for (const auto& wave : expected) EXPECT_EQ(LeaseAndCompleteWave(q, graph), wave);
  EXPECT_TRUE(q.Finished());
  auto r = q.Lease("w", kLease);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->task.has_value());
  EXPECT_TRUE(r->finished);
}

TEST(TaskQueueTest, BackwardWavefrontRunsFromLastLayerLastChunk) {
  TaskQueue q;
  Graph graph;
  for (int64_t k = kK - 1; k >= 0; --k) {  // dependencies first
    for (int64_t c = kC - 1; c >= 0; --c) {
      std::vector<int64_t> deps;  // backward (k, c) after (k+1, c) and (k, c+1)
      if (k + 1 < kK) deps.push_back(Id(k + 1, c));
      if (c + 1 < kC) deps.push_back(Id(k, c + 1));
      ASSERT_TRUE(q.AddTask(Id(k, c), "bwd", deps).ok());
      graph[Id(k, c)] = deps;
    }
  }
  const std::vector<std::vector<int64_t>> expected = {{11},      {7, 10}, {3, 6, 9},
                                                      {2, 5, 8}, {1, 4},  {0}};
  for (const auto& wave : expected) EXPECT_EQ(LeaseAndCompleteWave(q, graph), wave);
  EXPECT_TRUE(q.Finished());
}

TEST(TaskQueueTest, DependentWaitsForDoneNotMerelyLeased) {
  FakeClock clock;
  TaskQueue q(clock.AsClock());
  ASSERT_TRUE(q.AddTask(1, "a", {}).ok());
  ASSERT_TRUE(q.AddTask(2, "b", std::vector<int64_t>{1, 1}).ok());  // duplicate deps ignored
  auto a = q.Lease("w1", kLease);
  ASSERT_TRUE(a.ok() && a->task);
  EXPECT_EQ(a->task->payload, "a");
  auto none = q.Lease("w2", kLease);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->task.has_value());
  EXPECT_FALSE(none->finished);
  EXPECT_EQ(q.GetTask(2)->state, TaskState::kWaiting);
  EXPECT_EQ(q.GetTask(2)->unmet_dependencies, 1);
  ASSERT_TRUE(q.Complete(1, a->task->lease_id).ok());
  EXPECT_EQ(q.GetTask(2)->state, TaskState::kReady);
}

// A filtered lease (a span's tasks for its owner only) takes the lowest-id ready task the filter
// accepts and leaves the others ready for whoever may take them.
TEST(TaskQueueTest, EligibleFilterPicksTheLowestAcceptedReadyTask) {
  FakeClock clock;
  TaskQueue q(clock.AsClock());
  for (int64_t id : {1, 2, 3, 4}) ASSERT_TRUE(q.AddTask(id, "", {}).ok());
  auto even = [](int64_t id) { return id % 2 == 0; };
  auto a = q.Lease("w1", kLease, even);
  ASSERT_TRUE(a.ok() && a->task);
  EXPECT_EQ(a->task->task_id, 2);
  auto b = q.Lease("w1", kLease, even);
  ASSERT_TRUE(b.ok() && b->task);
  EXPECT_EQ(b->task->task_id, 4);
  auto none = q.Lease("w1", kLease, even);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->task.has_value());
  EXPECT_EQ(q.GetTask(1)->state, TaskState::kReady);
  auto any = q.Lease("w2", kLease);
  ASSERT_TRUE(any.ok() && any->task);
  EXPECT_EQ(any->task->task_id, 1);
}

TEST(TaskQueueTest, ExpiredLeaseIsHandedOutAgainWithAFreshLeaseId) {
  FakeClock clock;
  TaskQueue q(clock.AsClock());
  ASSERT_TRUE(q.AddTask(7, "t", {}).ok());
  auto first = q.Lease("w1", kLease);
  ASSERT_TRUE(first.ok() && first->task);
  EXPECT_EQ(first->task->attempt, 1);
  EXPECT_EQ(first->task->expiry, clock.Now() + kLease);
  clock.Advance(kLease - absl::Milliseconds(1));
  EXPECT_FALSE(q.Lease("w2", kLease)->task.has_value());  // still live
  EXPECT_EQ(q.Stats().leases_expired_total, 0);
  clock.Advance(absl::Milliseconds(1));  // now == expiry: expired
  auto second = q.Lease("w2", kLease);
  ASSERT_TRUE(second.ok() && second->task);
  EXPECT_EQ(second->task->task_id, 7);
  EXPECT_GT(second->task->lease_id, first->task->lease_id);
  EXPECT_EQ(second->task->attempt, 2);
  EXPECT_EQ(q.GetTask(7)->worker_id, "w2");
  EXPECT_EQ(q.Stats().leases_expired_total, 1);
}

TEST(TaskQueueTest, ExpireLeasesRequeuesAndCounts) {
  FakeClock clock;
  TaskQueue q(clock.AsClock());
  for (int64_t id : {1, 2, 3}) ASSERT_TRUE(q.AddTask(id, "", {}).ok());
  ASSERT_TRUE(q.Lease("w", absl::Seconds(1))->task);
  ASSERT_TRUE(q.Lease("w", absl::Seconds(5))->task);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(q.ExpireLeases(), 1);
  EXPECT_EQ(q.ExpireLeases(), 0);
  QueueStats s = q.Stats();
  EXPECT_EQ(s.ready, 2);
  EXPECT_EQ(s.leased, 1);
  EXPECT_EQ(s.leases_expired_total, 1);
  EXPECT_EQ(q.GetTask(1)->state, TaskState::kReady);
}

TEST(TaskQueueTest, LateResultAfterExpiryIsRejected) {
  FakeClock clock;
  TaskQueue q(clock.AsClock());
  ASSERT_TRUE(q.AddTask(1, "", {}).ok());
  ASSERT_TRUE(q.AddTask(2, "", {}).ok());
  // Expired, nobody has asked for work since: Complete itself notices.
  auto a = q.Lease("w1", kLease)->task;
  clock.Advance(kLease + absl::Seconds(1));
  EXPECT_TRUE(StatusIs(q.Complete(a->task_id, a->lease_id),
                       StatusCode::kFailedPrecondition, {"expired", "the task is ready"}));
  EXPECT_EQ(q.GetTask(1)->state, TaskState::kReady);
  // Expired and handed out again: the old holder is refused, the new one accepted.
  auto b = q.Lease("w2", kLease)->task;
  ASSERT_EQ(b->task_id, 1);
  auto c = q.Lease("w3", kLease)->task;  // task 2
  clock.Advance(kLease);
  auto c2 = q.Lease("w4", kLease)->task;  // task 1 again (lowest id), then task 2 stays ready
  ASSERT_EQ(c2->task_id, 1);
  EXPECT_TRUE(StatusIs(q.Complete(b->task_id, b->lease_id),
                       StatusCode::kFailedPrecondition, {"expired", "leased again under lease"}));
  EXPECT_TRUE(q.Complete(c2->task_id, c2->lease_id).ok());
  EXPECT_TRUE(StatusIs(q.Complete(c->task_id, c->lease_id),
                       StatusCode::kFailedPrecondition, {"expired"}));
  // A result from an earlier, superseded lease once the task is done: duplicate.
  EXPECT_TRUE(StatusIs(q.Complete(a->task_id, a->lease_id),
                       StatusCode::kFailedPrecondition, {"already done"}));
  QueueStats s = q.Stats();
  EXPECT_EQ(s.done, 1);
  EXPECT_EQ(s.results_rejected_total, 4);
  EXPECT_EQ(s.leases_expired_total, 3);
}

TEST(TaskQueueTest, DuplicateResultIsRejected) {
  TaskQueue q;
  ASSERT_TRUE(q.AddTask(1, "", {}).ok());
  auto t = q.Lease("w", kLease)->task;
  EXPECT_TRUE(q.Complete(t->task_id, t->lease_id).ok());
  EXPECT_TRUE(StatusIs(q.Complete(t->task_id, t->lease_id),
                       StatusCode::kFailedPrecondition, {"task 1 is already done"}));
  EXPECT_EQ(q.Stats().done, 1);
  EXPECT_EQ(q.Stats().results_rejected_total, 1);
  EXPECT_EQ(q.GetTask(1)->done_order, 0);
}

TEST(TaskQueueTest, UnknownTaskIsNotFoundAndUnknownLeaseIsRefused) {
  TaskQueue q;
  ASSERT_TRUE(q.AddTask(1, "", {}).ok());
  EXPECT_TRUE(StatusIs(q.Complete(99, 1), StatusCode::kNotFound, {"no task 99"}));
  EXPECT_TRUE(StatusIs(q.Renew(99, 1, "w"), StatusCode::kNotFound));
  EXPECT_TRUE(StatusIs(q.Release(99, 1), StatusCode::kNotFound));
  EXPECT_TRUE(StatusIs(q.GetTask(99), StatusCode::kNotFound));
  EXPECT_EQ(q.Stats().results_rejected_total, 0);  // nothing to count against
  EXPECT_TRUE(StatusIs(q.Complete(1, 1),
                       StatusCode::kFailedPrecondition, {"not the task's current"}));
  auto t = q.Lease("w", kLease)->task;
  EXPECT_TRUE(StatusIs(q.Complete(1, t->lease_id + 100),
                       StatusCode::kFailedPrecondition, {"not the task's current lease"}));
  EXPECT_TRUE(q.Complete(1, t->lease_id).ok());
}

TEST(TaskQueueTest, RenewKeepsALeaseAlivePastItsOriginalExpiry) {
  FakeClock clock;
  TaskQueue q(clock.AsClock());
  ASSERT_TRUE(q.AddTask(1, "", {}).ok());
  auto t = q.Lease("w1", kLease)->task;
  clock.Advance(absl::Seconds(8));
  auto expiry = q.Renew(1, t->lease_id, "w1");
  ASSERT_TRUE(expiry.ok()) << expiry.status();
  EXPECT_EQ(*expiry, clock.Now() + kLease);
  EXPECT_TRUE(StatusIs(q.Renew(1, t->lease_id, "w2"),
                       StatusCode::kFailedPrecondition, {"belongs to worker w1"}));
  clock.Advance(absl::Seconds(4));  // 12 s after the lease: past the original 10 s
  EXPECT_EQ(q.ExpireLeases(), 0);
  EXPECT_FALSE(q.Lease("w2", kLease)->task.has_value());
  EXPECT_TRUE(q.Complete(1, t->lease_id).ok());
  EXPECT_EQ(q.Stats().leases_expired_total, 0);
}

TEST(TaskQueueTest, RenewAfterExpiryIsRefused) {
  FakeClock clock;
  TaskQueue q(clock.AsClock());
  ASSERT_TRUE(q.AddTask(1, "", {}).ok());
  auto t = q.Lease("w1", kLease)->task;
  clock.Advance(kLease);
  EXPECT_TRUE(StatusIs(q.Renew(1, t->lease_id, "w1"),
                       StatusCode::kFailedPrecondition, {"expired"}));
  EXPECT_EQ(q.GetTask(1)->state, TaskState::kReady);
}

TEST(TaskQueueTest, ReleaseRequeuesTheTask) {
  TaskQueue q;
  ASSERT_TRUE(q.AddTask(1, "p", {}).ok());
  auto t = q.Lease("w1", kLease)->task;
  EXPECT_TRUE(q.Release(1, t->lease_id).ok());
  EXPECT_EQ(q.GetTask(1)->state, TaskState::kReady);
  EXPECT_EQ(q.Stats().leases_released_total, 1);
  EXPECT_TRUE(StatusIs(q.Release(1, t->lease_id), StatusCode::kFailedPrecondition, {"released"}));
  EXPECT_TRUE(StatusIs(q.Complete(1, t->lease_id), StatusCode::kFailedPrecondition, {"released"}));
  auto again = q.Lease("w2", kLease)->task;
  ASSERT_TRUE(again);
  EXPECT_EQ(again->task_id, 1);
  EXPECT_EQ(again->attempt, 2);
  EXPECT_EQ(again->payload, "p");
  EXPECT_TRUE(q.Complete(1, again->lease_id).ok());
}

TEST(TaskQueueTest, ReleaseWorkerRequeuesAllOfItsTasks) {
  TaskQueue q;
  for (int64_t id : {1, 2, 3}) ASSERT_TRUE(q.AddTask(id, "", {}).ok());
  auto a = q.Lease("w1", kLease)->task;
  auto b = q.Lease("w2", kLease)->task;
  auto c = q.Lease("w1", kLease)->task;
  EXPECT_EQ(q.ReleaseWorker("w1"), 2);
  EXPECT_EQ(q.ReleaseWorker("nobody"), 0);
  QueueStats s = q.Stats();
  EXPECT_EQ(s.ready, 2);
  EXPECT_EQ(s.leased, 1);
  EXPECT_EQ(s.leases_released_total, 2);
  EXPECT_TRUE(StatusIs(q.Complete(a->task_id, a->lease_id),
                       StatusCode::kFailedPrecondition, {"revoked"}));
  EXPECT_TRUE(StatusIs(q.Complete(c->task_id, c->lease_id), StatusCode::kFailedPrecondition));
  EXPECT_TRUE(q.Complete(b->task_id, b->lease_id).ok());
}

TEST(TaskQueueTest, AddTaskAndLeaseValidateTheirArguments) {
  TaskQueue q;
  EXPECT_TRUE(q.Finished());  // empty: nothing to do
  ASSERT_TRUE(q.AddTask(1, "", {}).ok());
  EXPECT_FALSE(q.Finished());
  EXPECT_TRUE(StatusIs(q.AddTask(1, "", {}), StatusCode::kAlreadyExists, {"task 1"}));
  EXPECT_TRUE(StatusIs(q.AddTask(2, "", std::vector<int64_t>{1, 5}),
                       StatusCode::kInvalidArgument, {"depends on task 5"}));
  EXPECT_TRUE(StatusIs(q.AddTask(3, "", std::vector<int64_t>{3}), StatusCode::kInvalidArgument));
  EXPECT_TRUE(StatusIs(q.GetTask(2), StatusCode::kNotFound));  // refused: no trace
  EXPECT_EQ(q.Stats().total, 1);
  EXPECT_TRUE(StatusIs(q.Lease("", kLease), StatusCode::kInvalidArgument, {"worker id"}));
  EXPECT_TRUE(StatusIs(q.Lease("w", absl::ZeroDuration()), StatusCode::kInvalidArgument));
  auto t = q.Lease("w", kLease)->task;
  ASSERT_TRUE(q.Complete(1, t->lease_id).ok());
  ASSERT_TRUE(q.AddTask(4, "", std::vector<int64_t>{1}).ok());  // dependency already done
  EXPECT_EQ(q.GetTask(4)->state, TaskState::kReady);
}

TEST(TaskQueueTest, ConcurrentResultsForOneLeaseAreAcceptedExactlyOnce) {
  constexpr int kTasks = 200, kThreads = 8;
  TaskQueue q;
  std::vector<LeasedTask> leases;
  for (int64_t id = 0; id < kTasks; ++id) ASSERT_TRUE(q.AddTask(id, "", {}).ok());
  for (int i = 0; i < kTasks; ++i) leases.push_back(*q.Lease("w", kLease)->task);
  std::vector<std::atomic<int>> accepted(kTasks);
  std::atomic<int> bad_code{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (const LeasedTask& lease : leases) {
        absl::Status s = q.Complete(lease.task_id, lease.lease_id);
        if (s.ok()) ++accepted[lease.task_id];
        else if (s.code() != StatusCode::kFailedPrecondition) ++bad_code;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int id = 0; id < kTasks; ++id) EXPECT_EQ(accepted[id].load(), 1) << "task " << id;
  EXPECT_EQ(bad_code.load(), 0);
  EXPECT_EQ(q.Stats().done, kTasks);
  EXPECT_EQ(q.Stats().results_rejected_total, (kThreads - 1) * kTasks);
}

// 8 workers lease, complete, abandon, release, renew and report late on a random 500-task DAG
// while the shared fake clock jumps forward: every task is accepted exactly once, and never
// handed out or done before its dependencies.
TEST(TaskQueueTest, StressEveryTaskDoneExactlyOnceInDependencyOrder) {
  constexpr int kTasks = 500, kThreads = 8;
  FakeClock clock;
  TaskQueue q(clock.AsClock());
  std::mt19937 graph_rng(42);
  std::vector<std::vector<int64_t>> deps(kTasks);
  for (int64_t i = 0; i < kTasks; ++i) {
    for (int j = static_cast<int>(graph_rng() % 4); i > 0 && j > 0; --j) {
      deps[i].push_back(i - 1 - static_cast<int64_t>(graph_rng() % std::min<int64_t>(i, 30)));
    }
    ASSERT_TRUE(q.AddTask(i, absl::StrCat("task ", i), deps[i]).ok());
  }

  std::vector<std::atomic<int>> accepted(kTasks);
  std::atomic<int> violations{0}, bad_codes{0}, wrong_payloads{0};
  auto run_worker = [&](int index) {
    const std::string worker = absl::StrCat("w", index);
    std::mt19937 rng(1000 + index);
    auto expect_refused = [&](const absl::Status& s) {
      if (s.code() != StatusCode::kFailedPrecondition) ++bad_codes;
    };
    auto complete = [&](const LeasedTask& t) {
      absl::Status s = q.Complete(t.task_id, t.lease_id);
      if (!s.ok()) {
        expect_refused(s);
        return false;
      }
      ++accepted[t.task_id];
      for (int64_t d : deps[t.task_id]) {
        if (q.GetTask(d)->state != TaskState::kDone) ++violations;
      }
      return true;
    };
    for (int iter = 0; iter < 1'000'000 && !q.Finished(); ++iter) {
      auto r = q.Lease(worker, absl::Milliseconds(1 + rng() % 50));
      if (!r.ok()) {
        ++bad_codes;
        return;
      }
      if (!r->task) {
        if (r->finished) return;
        clock.Advance(absl::Milliseconds(1 + rng() % 10));  // lets abandoned leases expire
        std::this_thread::yield();
        continue;
      }
      const LeasedTask t = *r->task;
      if (t.payload != absl::StrCat("task ", t.task_id)) ++wrong_payloads;
      for (int64_t d : deps[t.task_id]) {
        if (q.GetTask(d)->state != TaskState::kDone) ++violations;  // DONE never reverts
      }
      const int action = static_cast<int>(rng() % 100);
      if (action < 50) {
        complete(t);
      } else if (action < 60) {
        // abandon: the worker vanished; the lease must expire
      } else if (action < 70) {
        absl::Status s = q.Release(t.task_id, t.lease_id);
        if (!s.ok()) expect_refused(s);
      } else if (action < 80) {
        clock.Advance(absl::Milliseconds(rng() % 60));  // slow worker: maybe late
        complete(t);
      } else if (action < 90) {
        auto renewed = q.Renew(t.task_id, t.lease_id, worker);
        if (!renewed.ok()) expect_refused(renewed.status());
        complete(t);
      } else if (action < 95) {
        if (complete(t)) expect_refused(q.Complete(t.task_id, t.lease_id));  // duplicate
      } else {
        q.ReleaseWorker(worker);  // declared dead: its result must then be refused
        expect_refused(q.Complete(t.task_id, t.lease_id));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(run_worker, i);
  for (auto& th : threads) th.join();

  ASSERT_TRUE(q.Finished());
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(bad_codes.load(), 0);
  EXPECT_EQ(wrong_payloads.load(), 0);
  std::vector<int64_t> order(kTasks);
  std::vector<bool> seen(kTasks, false);
  for (int64_t i = 0; i < kTasks; ++i) {
    EXPECT_EQ(accepted[i].load(), 1) << "task " << i;
    auto info = q.GetTask(i);
    ASSERT_TRUE(info.ok());
    order[i] = info->done_order;
    ASSERT_TRUE(order[i] >= 0 && order[i] < kTasks);
    EXPECT_FALSE(seen[order[i]]) << "done_order " << order[i] << " twice";
    seen[order[i]] = true;
  }
  for (int64_t i = 0; i < kTasks; ++i) {
    for (int64_t d : deps[i]) EXPECT_LT(order[d], order[i]) << d << " -> " << i;
  }
  QueueStats s = q.Stats();
  EXPECT_EQ(s.done, kTasks);
  EXPECT_EQ(s.leased + s.ready + s.waiting, 0);
  EXPECT_EQ(s.leases_granted_total, s.done + s.leases_expired_total + s.leases_released_total);
  EXPECT_GT(s.leases_expired_total, 0);
  EXPECT_GT(s.leases_released_total, 0);
  EXPECT_GT(s.results_rejected_total, 0);
}

}  // namespace
}  // namespace adjsh::coordinator
