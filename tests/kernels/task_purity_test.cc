// A task's result is a pure function of its inputs: the same (layer, chunk) task run on a fresh
// thread (fresh per-thread scratch) and on threads that first ran other tasks (other layers,
// chunk lengths, halos, the uneven last chunk) must give bitwise equal outputs. Workers run
// whatever tasks the queue hands them, so anything a task reads that its inputs do not fix
// (stale scratch, the address alignment of a reused buffer choosing a vector or a scalar path)
// shows up as results that differ between worker counts.
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/kernels/backward_task.h"
#include "kernels/backend.h"
#include "gtest/gtest.h"
#include "kernels/cpu/mamba_block.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

struct Shape {
  int64_t D, N, W, R;
};

template <typename T>
std::vector<T> Normal(int64_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(dist(rng));
  return v;
}

// One backward task with random inputs: the layer's parameters and the task's rows.
template <typename T>
struct Case {
  MambaConfig config;
  ModelParams<T> params;
  BackwardTaskInputs<T> in;
};

template <typename T>
Case<T> MakeCase(const Shape& s, int64_t layer, int64_t halo, int64_t len, bool last,
                 uint64_t seed) {
  Case<T> c;
  c.config = testing::SmallConfig(layer + 1, s.D, s.N, s.W, s.R, 11);
  c.params = InitParams<T>(c.config, seed);
  std::mt19937_64 rng(seed * 7919 + 1);
  const int64_t D = s.D, DiN = c.config.inner() * s.N;
  c.in.layer = layer;
  c.in.chunk = 1;
  c.in.rows = {halo, len, 0};
  c.in.u = Normal<T>((halo + len) * D, rng);
  c.in.g = Normal<T>(len * D, rng, 0.1);
  c.in.h0 = Normal<T>(DiN, rng, 0.5);
  if (!last) c.in.mu = Normal<T>(DiN, rng, 0.1);
  return c;
}

template <typename T>
struct Result {
  BackwardTaskOutputs<T> out;
  std::vector<T> u_next, h_end;  // the block's forward over the same rows
};

// Runs the task's backward and its forward with a block built afresh on the CPU backend, as a
// worker does.
template <typename T>
void RunCase(const Case<T>& c, Result<T>& r) {
  std::unique_ptr<Backend<T>> backend = MakeBackend<T>(Device{}).value();
  std::unique_ptr<BlockBackend<T>> block =
      backend->MakeBlock(c.config, c.params.layers[c.in.layer]);
  RunBackwardTask(*block, c.config, c.in, r.out);
  const int64_t D = c.config.hidden_size, DiN = c.config.inner() * c.config.state_size;
  r.u_next.assign(c.in.rows.len * D, T(0));
  r.h_end.assign(DiN, T(0));
  block->Forward(c.in.u.data(), c.in.rows, c.in.h0.data(), r.u_next.data(), r.h_end.data());
}

template <typename T>
bool Same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
::testing::AssertionResult SameResult(const Result<T>& a, const Result<T>& b) {
  const auto& slots = LayerParamSlots<T>();
  for (const auto& slot : slots)
    if (!Same(a.out.grad.*slot.member, b.out.grad.*slot.member))
      return ::testing::AssertionFailure() << "partial gradient " << slot.suffix << " differs";
  if (!Same(a.out.du, b.out.du)) return ::testing::AssertionFailure() << "du differs";
  if (!Same(a.out.du_halo, b.out.du_halo)) return ::testing::AssertionFailure() << "du_halo differs";
  if (!Same(a.out.mu_out, b.out.mu_out)) return ::testing::AssertionFailure() << "mu_out differs";
  if (!Same(a.u_next, b.u_next)) return ::testing::AssertionFailure() << "forward u_next differs";
  if (!Same(a.h_end, b.h_end)) return ::testing::AssertionFailure() << "forward h_end differs";
  return ::testing::AssertionSuccess();
}

// Runs fn on a new thread, so that every thread_local scratch buffer starts empty.
void OnFreshThread(const std::function<void()>& fn) { std::thread(fn).join(); }

template <typename T>
void CheckPure(const Shape& s) {
  // The task under test: layer 1, a middle chunk with a full halo, 37 rows (odd: every vector
  // loop has a remainder), and chunk-0-like and last-chunk-like variants.
  struct Variant {
    int64_t halo, len;
    bool last;
  };
  const std::vector<Variant> variants = {{s.W - 1, 37, false}, {0, 32, false}, {s.W - 1, 5, true},
                                         {s.W - 1, 1, false}};
  // Tasks run before it: other layers, lengths and halos, larger and smaller buffers.
  std::vector<Case<T>> history;
  history.push_back(MakeCase<T>(s, 0, 0, 64, false, 11));
  history.push_back(MakeCase<T>(s, 2, s.W - 1, 3, true, 12));
  history.push_back(MakeCase<T>(s, 1, 1, 200, false, 13));
  history.push_back(MakeCase<T>(s, 0, s.W - 1, 1, false, 14));
  for (const Variant& v : variants) {
    const Case<T> task = MakeCase<T>(s, 1, v.halo, v.len, v.last, 5);
    Result<T> fresh;
    OnFreshThread([&] { RunCase(task, fresh); });
    // Histories of 0..4 earlier tasks, each after a heap allocation of a different size, so
    // that reused and newly allocated buffers land at every 4-byte offset of a cache line.
    for (size_t n = 0; n <= history.size(); ++n) {
      for (int shift = 0; shift < 16; ++shift) {
        Result<T> again;
        OnFreshThread([&] {
          std::vector<std::unique_ptr<char[]>> pad;
          for (size_t h = 0; h < n; ++h) {
            pad.emplace_back(new char[4 * (shift + h) + 1]);
            Result<T> other;
            RunCase(history[h], other);
          }
          // The task's inputs arrive in fresh buffers (as a worker receives them), at shifted
          // addresses too.
          Case<T> copy;
          copy.config = task.config;
          copy.params = task.params;
          copy.in.layer = task.in.layer, copy.in.chunk = task.in.chunk, copy.in.rows = task.in.rows;
          for (auto [from, to] : {std::pair{&task.in.u, &copy.in.u}, {&task.in.g, &copy.in.g},
                                  {&task.in.h0, &copy.in.h0}, {&task.in.mu, &copy.in.mu}}) {
            pad.emplace_back(new char[4 * shift + 1]);
            *to = *from;
          }
          RunCase(copy, again);
        });
        ASSERT_TRUE(SameResult(fresh, again))
            << "halo " << v.halo << " len " << v.len << (v.last ? " (last chunk)" : "")
            << " after " << n << " other tasks, heap shift " << shift;
      }
    }
  }
}

TEST(TaskPurityTest, TinyWidthF32) { CheckPure<float>({8, 4, 4, 2}); }
TEST(TaskPurityTest, StateSize16F32) { CheckPure<float>({16, 16, 4, 2}); }
TEST(TaskPurityTest, OddWidthF32) { CheckPure<float>({12, 3, 3, 1}); }
TEST(TaskPurityTest, TinyWidthF64) { CheckPure<double>({8, 4, 4, 2}); }
TEST(TaskPurityTest, StateSize16F64) { CheckPure<double>({16, 16, 4, 2}); }

}  // namespace
}  // namespace adjsh
