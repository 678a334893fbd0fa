// The whole CUDA block and head (kernels/cuda/device_block.cu, lm_head.cu with the scan and op
// kernels) compiled for the host: kernels run block by block on host threads
// (host_emulation.h), device memory is host memory, and cuBLAS is replaced by a plain GEMM with
// f32 sums over the same row-major operands. Checked against the CPU block and head in f64,
// with f32 and bf16 storage: every output of the block interface (the span schedule's
// summaries included) and of the head. This covers the host code's orchestration (workspace
// layout, GEMM operands and transposes, the order of kernels) without a GPU; cuda_backend_test
// checks the same on a GPU. And the context's byte counts (MemoryCounts), under threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "tests/cuda/emulated_device.h"
#include "tests/cuda/block_check.h"

namespace adjsh {
namespace {

class BlockEmulationTest : public ::testing::TestWithParam<bool> {};

// f32 storage: each tensor within 1e-5 of f64 (as on the GPU); bf16 storage: the whole set of
// outputs within 2e-2 (roundings of 2e-3 through a few operations).
TEST_P(BlockEmulationTest, BlockMatchesCpuF64) {
  const bool bf16 = GetParam();
  const double tol = bf16 ? 2e-2 : 1e-5;
  const MambaConfig config = testing::SmallConfig(1, 16, 8, 4, 3, 29);
  // halo 3, len 70: two scan segments.
  const testing::BlockCheck c = testing::CheckBlockAgainstCpu(config, 12, 3, 3, 70, bf16);
  for (size_t q = 0; q < c.errors.size() && !bf16; ++q) EXPECT_LT(c.errors[q], tol) << c.names[q];
  EXPECT_LT(c.whole, tol);
}

// The chunk summaries of the span schedule, f32 storage within 1e-5 of f64 per output, bf16
// within 2e-2. halo 3, len 150: three scan segments joined.
TEST_P(BlockEmulationTest, SummariesMatchCpuF64) {
  const bool bf16 = GetParam();
  const double tol = bf16 ? 2e-2 : 1e-5;
  const MambaConfig config = testing::SmallConfig(1, 16, 8, 4, 3, 29);
  const testing::SummaryCheck c = testing::CheckSummariesAgainstCpu(config, 12, 5, 3, 150, bf16);
  EXPECT_LT(c.h_local, tol) << "h_local";
  EXPECT_LT(c.S_fwd, tol) << "S (forward)";
  EXPECT_LT(c.m, tol) << "m";
  EXPECT_LT(c.S_adj, tol) << "S (adjoint)";
}

TEST_P(BlockEmulationTest, HeadMatchesCpuF64) {
  const bool bf16 = GetParam();
  const double tol = bf16 ? 2e-2 : 1e-5;
  const int64_t M = 21, D = 8, V = 40;  // three row and three vocabulary blocks, both ragged
  std::vector<int64_t> targets(M);
  for (int64_t t = 0; t < M; ++t) targets[t] = t + 1 < M ? (t * 7919) % V : -1;
  const testing::HeadCheck c = testing::CheckHeadAgainstCpu(M, D, V, 4, targets, bf16);
  EXPECT_NEAR(c.loss32, c.loss, (bf16 ? 1e-2 : 1e-5) * c.loss);
  EXPECT_LT(c.du, tol) << "du";
  EXPECT_LT(c.dE, tol) << "dE";
  EXPECT_LT(c.dw_f, tol) << "dw_f";
}

// The context's byte counts (context.h), which the worker's GPU gauges read from another thread:
// the peak since the last ResetPeak and the one since the start.
TEST(MemoryCountsTest, PeaksFollowHeldAndResetPeakLeavesTheStartPeak) {
  cuda::MemoryCounts c;
  c.Add(100);
  c.Add(50);
  EXPECT_EQ(c.held(), 150);
  EXPECT_EQ(c.peak(), 150);
  EXPECT_EQ(c.peak_since_start(), 150);
  c.Add(-120);
  EXPECT_EQ(c.held(), 30);
  EXPECT_EQ(c.peak(), 150);
  c.ResetPeak();
  EXPECT_EQ(c.peak(), 30);
  EXPECT_EQ(c.peak_since_start(), 150);
  c.Add(40);
  EXPECT_EQ(c.held(), 70);
  EXPECT_EQ(c.peak(), 70);
  EXPECT_EQ(c.peak_since_start(), 150);
}

// Threads allocating and freeing at once: no change is lost (held ends at 0) and the peak is
// at least what each thread alone held, at most what all held together.
TEST(MemoryCountsTest, ConcurrentChangesLoseNothing) {
  cuda::MemoryCounts c;
  constexpr int kThreads = 4, kRounds = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&c, bytes = int64_t{1} << (4 * t)] {
      for (int r = 0; r < kRounds; ++r) {
        c.Add(bytes);
        c.Add(-bytes);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c.held(), 0);
  EXPECT_GE(c.peak_since_start(), int64_t{1} << (4 * (kThreads - 1)));
  EXPECT_LE(c.peak_since_start(), 0x1111);
  EXPECT_EQ(c.peak(), c.peak_since_start());
}

// Every host-device copy and sync of a call is counted, per thread (Backend::ThreadTraffic) and
// per device, by the Context the block's code calls: a chunk forward moves its rows and start
// state up and its output rows and end state down with one sync; the exact backward moves its
// rows, g, h0, mu and the layer's whole gradient up, and du (with the halo's rows), mu_out and
// the gradient down, with one sync. Another thread's calls are not this thread's.
TEST(BlockTrafficTest, EveryCopyAndSyncOfACallIsCounted) {
  const MambaConfig config = testing::SmallConfig(1, 16, 8, 4, 3, 29);
  const ModelParams<float> p32 = InitParams<float>(config, 21);
  const int64_t D = config.hidden_size, DiN = config.inner() * config.state_size;
  const int64_t halo = 3, len = 40, P = halo + len, f = sizeof(float);
  cuda::DeviceBlock block(0, false, cuda::BlockShapeOf(config),
                          cuda::LayerTensorsOf<const float>(p32.layers[0]));
  std::vector<float> u(P * D, 0.5f), h0(DiN, 0.1f), mu(DiN, 0.01f), g(len * D, 0.02f);
  std::vector<float> u_next(len * D), h_end(DiN), du(len * D), du_halo(halo * D), mu_out(DiN);
  LayerParams<float> grad = ZeroLayer<float>(config);
  int64_t grad_values = 0;
  for (const auto& slot : LayerParamSlots<float>()) grad_values += (grad.*slot.member).size();
  block.Forward(u.data(), halo, len, h0.data(), u_next.data(), h_end.data());  // workspace grown

  const DeviceTraffic before = cuda::ThreadTraffic();
  block.Forward(u.data(), halo, len, h0.data(), u_next.data(), h_end.data());
  DeviceTraffic d = cuda::ThreadTraffic() - before;
  EXPECT_EQ(d.h2d_bytes, static_cast<uint64_t>((P * D + DiN) * f));
  EXPECT_EQ(d.d2h_bytes, static_cast<uint64_t>((len * D + DiN) * f));
  EXPECT_EQ(d.h2d_copies, 2u);
  EXPECT_EQ(d.d2h_copies, 2u);
  EXPECT_EQ(d.syncs, 1u);
  EXPECT_EQ(d.allocations, 0u);

  const DeviceTraffic mid = cuda::ThreadTraffic();
  block.Backward(u.data(), halo, len, g.data(), h0.data(), mu.data(),
                 cuda::LayerTensorsOf<float>(grad), du.data(), du_halo.data(), mu_out.data());
  d = cuda::ThreadTraffic() - mid;
  EXPECT_EQ(d.h2d_bytes, static_cast<uint64_t>((P * D + len * D + 2 * DiN + grad_values) * f));
  EXPECT_EQ(d.d2h_bytes, static_cast<uint64_t>((P * D + DiN + grad_values) * f));
  EXPECT_EQ(d.h2d_copies, 5u);
  EXPECT_EQ(d.d2h_copies, 3u);
  EXPECT_EQ(d.syncs, 1u);

  const DeviceTraffic mine = cuda::ThreadTraffic();
  std::thread other([&] {
    std::vector<float> next(len * D), end(DiN);
    block.Forward(u.data(), halo, len, nullptr, next.data(), end.data());
    EXPECT_EQ(cuda::ThreadTraffic().h2d_copies, 1u) << "no h0: the rows alone go up";
  });
  other.join();
  EXPECT_TRUE((cuda::ThreadTraffic() - mine).empty());
}

// A task's chunks with the sum left on the device (defer_grad) and brought down once by
// FinishBackward: the same bits as the sum moved both ways per call (one f32 add per entry per
// call, in the same order), the layer's gradient uploaded once and downloaded once, one
// device allocation for the task's accumulator; FinishBackward without an open sum does
// nothing.
// A resident head's evaluation (a forward-only step's head task): Loss gives ForwardBackward's
// loss bit for bit, runs no backward (no norm_f partial comes down), and waits once. Rows,
// ids and partials in device memory, as a resident span's are.
TEST(BlockTrafficTest, AResidentHeadsLossIsItsForwardBackwardsWithoutTheBackward) {
  // M and V over several of the emulated head's blocks (8 rows by 16 of the vocabulary).
  const MambaConfig config = testing::SmallConfig(1, 16, 8, 4, 3, 40);
  const ModelParams<float> p = InitParams<float>(config, 23);
  const int64_t D = config.hidden_size, V = config.vocab_size, M = 19, valid = 18;
  cuda::DeviceHeadWeights head(0, false, V, D, p.embed.data(), p.head().data(),
                               p.norm_f.data());
  std::vector<float> u(M * D);
  std::vector<uint32_t> ids(M);
  for (int64_t i = 0; i < M * D; ++i) u[i] = std::sin(0.37f * static_cast<float>(i));
  for (int64_t t = 0; t < M; ++t) ids[t] = static_cast<uint32_t>((t * 53 + 7) % V);
  float* u_d = cuda::RowsAlloc(0, M * D);
  float* ids_d = cuda::RowsAlloc(0, M);
  float* du_d = cuda::RowsAlloc(0, M * D);
  float* dE_d = cuda::RowsAlloc(0, V * D);
  cuda::RowsUpload(0, u_d, u.data(), M * D);
  cuda::RowsUpload(0, ids_d, reinterpret_cast<const float*>(ids.data()), M);
  cuda::RowsZero(0, dE_d, V * D);
  std::vector<float> dw_f(D, 0.0f);
  const auto* next = reinterpret_cast<const uint32_t*>(ids_d);
  const double full = head.ForwardBackward(M, 1e-5f, u_d, next, valid, 1.0f / valid, du_d,
                                           dE_d, dw_f.data(), nullptr);
  const DeviceTraffic before = cuda::ThreadTraffic();
  const double alone = head.Loss(M, 1e-5f, u_d, next, valid);
  const DeviceTraffic d = cuda::ThreadTraffic() - before;
  EXPECT_EQ(std::memcmp(&alone, &full, sizeof(double)), 0) << alone << " " << full;
  EXPECT_GT(full, 0.0);
  EXPECT_EQ(d.d2h_bytes, sizeof(double));  // the loss; no norm_f partial
  EXPECT_EQ(d.h2d_bytes, 0u);
  EXPECT_EQ(d.syncs, 1u);
  cuda::RowsFinish(0);
  cuda::RowsFree(0, u_d, M * D);
  cuda::RowsFree(0, ids_d, M);
  cuda::RowsFree(0, du_d, M * D);
  cuda::RowsFree(0, dE_d, V * D);
}

TEST(BlockTrafficTest, ADeferredGradientMovesOnceAndSumsTheSameBits) {
  const MambaConfig config = testing::SmallConfig(1, 16, 8, 4, 3, 29);
  const ModelParams<float> p32 = InitParams<float>(config, 22);
  const int64_t D = config.hidden_size, DiN = config.inner() * config.state_size;
  const int64_t halo = 3, len = 24, P = halo + len, f = sizeof(float), chunks = 3;
  cuda::DeviceBlock block(0, false, cuda::BlockShapeOf(config),
                          cuda::LayerTensorsOf<const float>(p32.layers[0]));
  std::mt19937_64 rng(4);
  std::normal_distribution<float> dist(0, 1);
  auto random = [&](int64_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * dist(rng);
    return v;
  };
  std::vector<std::vector<float>> u, g, h0, mu;
  for (int64_t c = 0; c < chunks; ++c) {
    u.push_back(random(P * D, 1)), g.push_back(random(len * D, 0.05f));
    h0.push_back(random(DiN, 0.2f)), mu.push_back(random(DiN, 0.05f));
  }
  auto task = [&](bool defer, LayerParams<float>& grad) {
    std::vector<float> du(len * D), du_halo(halo * D), mu_out(DiN);
    for (int64_t c = 0; c < chunks; ++c)
      block.Backward(u[c].data(), halo, len, g[c].data(), h0[c].data(), mu[c].data(),
                     cuda::LayerTensorsOf<float>(grad), du.data(), du_halo.data(), mu_out.data(),
                     defer);
    if (defer) block.FinishBackward(cuda::LayerTensorsOf<float>(grad));
  };
  LayerParams<float> per_call = ZeroLayer<float>(config), deferred = ZeroLayer<float>(config);
  int64_t grad_values = 0;
  for (const auto& slot : LayerParamSlots<float>()) grad_values += (per_call.*slot.member).size();
  task(false, per_call);
  const DeviceTraffic before = cuda::ThreadTraffic();
  task(true, deferred);
  const DeviceTraffic d = cuda::ThreadTraffic() - before;
  for (const auto& slot : LayerParamSlots<float>()) {
    const std::vector<float>& a = per_call.*slot.member;
    const std::vector<float>& b = deferred.*slot.member;
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << slot.suffix;
  }
  const uint64_t rows_up = chunks * (P * D + len * D + 2 * DiN) * f;
  const uint64_t rows_down = chunks * (P * D + DiN) * f;
  EXPECT_EQ(d.h2d_bytes, rows_up + static_cast<uint64_t>(grad_values * f));
  EXPECT_EQ(d.d2h_bytes, rows_down + static_cast<uint64_t>(grad_values * f));
  EXPECT_EQ(d.syncs, static_cast<uint64_t>(chunks + 1));  // each call's, and FinishBackward's
  EXPECT_EQ(d.allocations, 1u);
  const DeviceTraffic idle = cuda::ThreadTraffic();
  block.FinishBackward(cuda::LayerTensorsOf<float>(deferred));  // nothing open: nothing moves
  EXPECT_TRUE((cuda::ThreadTraffic() - idle).empty());
}

// The block's host transfers go through one pinned staging buffer per block (cudaHostAlloc,
// emulated_device.h counts it): allocated once, kept for calls that fit, grown for a larger
// chunk, freed with the block. And Backward accumulates: from a non-zero grad G0 the result is
// G0 + (the call's gradient from zeros), bitwise (one f32 add per entry, as the host did).
TEST(BlockStagingTest, PinnedStagingIsKeptGrownAndFreedAndGradAccumulates) {
  const MambaConfig config = testing::SmallConfig(1, 16, 8, 4, 3, 29);
  const ModelParams<float> p32 = InitParams<float>(config, 21);
  const LayerParams<float>& w = p32.layers[0];
  const int64_t D = config.hidden_size, DiN = config.inner() * config.state_size, halo = 2;
  {  // The context's own staging (kernels/cuda/staging.cu) made first, larger than the block's
    // parameters, so that what is counted below is the block's alone, in any test order.
    cuda::Context& ctx = cuda::Context::Get(0);
    std::lock_guard<std::mutex> lock(ctx.mutex());
    const size_t n = size_t{1} << 18;
    float* dev = static_cast<float*>(ctx.Alloc(n * sizeof(float)));
    const std::vector<float> zeros(n, 0.0f);
    ctx.Upload(dev, zeros.data(), n * sizeof(float));
    ctx.Sync();
    ctx.Free(dev, n * sizeof(float));
  }
  const int64_t live0 = emulation::pinned_live, bytes0 = emulation::pinned_live_bytes;
  auto block = std::make_unique<cuda::DeviceBlock>(0, false, cuda::BlockShapeOf(config),
                                                   cuda::LayerTensorsOf<const float>(w));
  std::mt19937_64 rng(8);
  std::normal_distribution<float> dist(0, 1);
  auto random = [&](int64_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * dist(rng);
    return v;
  };
  auto backward = [&](int64_t len, LayerParams<float>& grad) {
    std::mt19937_64 seeded(len);
    std::normal_distribution<float> d(0, 1);
    auto rnd = [&](int64_t n, float scale) {
      std::vector<float> v(n);
      for (float& x : v) x = scale * d(seeded);
      return v;
    };
    const std::vector<float> u = rnd((halo + len) * D, 1), h0 = rnd(DiN, 0.2f),
                             mu = rnd(DiN, 0.05f), g = rnd(len * D, 0.05f);
    std::vector<float> du(len * D), dh(halo * D), mo(DiN);
    block->Backward(u.data(), halo, len, g.data(), h0.data(), mu.data(),
                    cuda::LayerTensorsOf<float>(grad), du.data(), dh.data(), mo.data());
  };
  const auto& slots = LayerParamSlots<float>();
  LayerParams<float> from_zero = ZeroLayer<float>(config);
  backward(40, from_zero);
  EXPECT_EQ(emulation::pinned_live, live0 + 1);
  const int64_t allocs = emulation::pinned_allocs, bytes = emulation::pinned_live_bytes;

  LayerParams<float> acc = ZeroLayer<float>(config), g0 = ZeroLayer<float>(config);
  for (const auto& slot : slots) {
    (g0.*slot.member) = random(static_cast<int64_t>((g0.*slot.member).size()), 0.3f);
    acc.*slot.member = g0.*slot.member;
  }
  backward(40, acc);
  for (const auto& slot : slots) {
    const std::vector<float>& a = acc.*slot.member;
    const std::vector<float>& z = from_zero.*slot.member;
    const std::vector<float>& o = g0.*slot.member;
    for (size_t k = 0; k < a.size(); ++k) {
      const float want = o[k] + z[k];
      ASSERT_EQ(std::memcmp(&a[k], &want, sizeof(float)), 0) << slot.suffix << "[" << k << "]";
    }
  }
  backward(20, acc);  // fits: kept
  EXPECT_EQ(emulation::pinned_allocs, allocs);
  EXPECT_EQ(emulation::pinned_live_bytes, bytes);
  backward(90, acc);  // larger: grown, still one buffer
  EXPECT_EQ(emulation::pinned_allocs, allocs + 1);
  EXPECT_EQ(emulation::pinned_live, live0 + 1);
  EXPECT_GT(emulation::pinned_live_bytes, bytes);
  block.reset();
  EXPECT_EQ(emulation::pinned_live, live0);
  EXPECT_EQ(emulation::pinned_live_bytes, bytes0);
}

INSTANTIATE_TEST_SUITE_P(Storage, BlockEmulationTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "bf16" : "f32";
                         });

}  // namespace
}  // namespace adjsh
