#include "common/thread_pool.h"

#include <set>
#include <tuple>

namespace adjsh {

int PoolThreads(int threads) {
  if (threads > 0) return threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int threads) {
  threads = PoolThreads(threads);
  for (int k = 1; k < threads; ++k) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::RunShare() {
  for (;;) {
    int64_t i;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_ >= n_) return;
      i = next_++;
    }
    (*fn_)(i);
  }
}

void ThreadPool::WorkerLoop() {
  int64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++busy_;
    }
    RunShare();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --busy_;
    }
    done_cv_.notify_all();
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    ++generation_;
  }
  cv_.notify_all();
  RunShare();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return busy_ == 0 && next_ >= n_; });
  fn_ = nullptr;
}

void RunDag(ThreadPool& pool, int64_t n,
            const std::function<std::vector<int64_t>(int64_t)>& successors,
            const std::function<void(int64_t)>& fn,
            const std::function<int64_t(int64_t)>& rank) {
  std::vector<std::vector<int64_t>> succ(n);
  std::vector<int64_t> waiting(n, 0);  // unfinished predecessors
  for (int64_t t = 0; t < n; ++t) {
    succ[t] = successors(t);
    for (int64_t s : succ[t]) ++waiting[s];
  }
  std::mutex mu;
  std::condition_variable cv;
  // (rank, when it became ready, task): the first is the next to run.
  std::set<std::tuple<int64_t, int64_t, int64_t>> ready;
  int64_t became_ready = 0;
  auto make_ready = [&](int64_t t) { ready.emplace(rank ? rank(t) : 0, became_ready++, t); };
  for (int64_t t = 0; t < n; ++t)
    if (waiting[t] == 0) make_ready(t);
  int64_t finished = 0;
  pool.ParallelFor(pool.size(), [&](int64_t) {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return !ready.empty() || finished == n; });
      if (ready.empty()) return;  // all done
      const int64_t t = std::get<2>(*ready.begin());
      ready.erase(ready.begin());
      lock.unlock();
      fn(t);
      lock.lock();
      ++finished;
      for (int64_t s : succ[t])
        if (--waiting[s] == 0) make_ready(s);
      cv.notify_all();
    }
  });
}

}  // namespace adjsh
