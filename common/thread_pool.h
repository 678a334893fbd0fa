// A fixed pool of threads for the engine's task loops. The caller's thread works too, so a pool
// of size 1 runs everything inline.
#ifndef ADJSH_COMMON_THREAD_POOL_H_
#define ADJSH_COMMON_THREAD_POOL_H_

#include <condition_variable>
#include <deque>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace adjsh {

// The threads ThreadPool(threads) runs: threads, or one per hardware thread when threads <= 0.
int PoolThreads(int threads);

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: one per hardware thread (PoolThreads)
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, n), indices handed out in increasing order; returns when all
  // are done. fn must not throw.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunShare();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;       // workers wait for a new generation
  std::condition_variable done_cv_;  // the caller waits for the workers to finish a generation
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t next_ = 0;       // next index to hand out (guarded by mu_)
  int64_t generation_ = 0;
  int busy_ = 0;           // workers inside the current generation
  bool stop_ = false;
};

// Runs produce(i) in parallel and consume(i, result) strictly in increasing i, one at a time, on
// whichever thread completes the prefix. This is how adjsh adds task partials in task order:
// the sum is the same for any thread count. At most max_ahead results wait unconsumed.
template <typename R>
void OrderedParallelFor(ThreadPool& pool, int64_t n, int64_t max_ahead,
                        const std::function<R(int64_t)>& produce,
                        const std::function<void(int64_t, R&&)>& consume) {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int64_t, R> ready;
  int64_t next = 0;
  bool consuming = false;
  pool.ParallelFor(n, [&](int64_t i) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return i < next + max_ahead; });
    }
    R result = produce(i);
    std::unique_lock<std::mutex> lock(mu);
    ready.emplace(i, std::move(result));
    if (consuming) return;  // the thread consuming now will reach this result
    consuming = true;
    while (!ready.empty() && ready.begin()->first == next) {
      auto node = ready.extract(ready.begin());
      lock.unlock();
      consume(next, std::move(node.mapped()));
      lock.lock();
      ++next;
      cv.notify_all();
    }
    consuming = false;
  });
}

// Runs fn(task) for tasks [0, n) of a dependency graph: a task starts once every task that
// lists it among its successors has finished. Ready tasks are taken by rank(task), lowest
// first (no rank: all equal), and among equal ranks in the order they became ready; rank is
// asked once per task, when it becomes ready, under the graph's lock. The graph must be
// acyclic; fn must not throw.
void RunDag(ThreadPool& pool, int64_t n, const std::function<std::vector<int64_t>(int64_t)>& successors,
            const std::function<void(int64_t)>& fn,
            const std::function<int64_t(int64_t)>& rank = nullptr);

}  // namespace adjsh

#endif  // ADJSH_COMMON_THREAD_POOL_H_
