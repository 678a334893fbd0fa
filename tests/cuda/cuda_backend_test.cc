// The CUDA backend against the f64 CPU engine and the f64 oracle: gradients over a grid of
// shapes (K, T, chunk with T not a multiple of it, the conv halo across chunk edges), one block
// with an incoming state and adjoint, the span schedule's summaries and 1 to 16 spans, f32 and
// bf16 storage, bitwise run-to-run repeatability, device memory flat in T for a fixed chunk,
// and the memory probe of the worker's GPU gauges.
// Every test skips where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/adjoint_engine.h"
#include "kernels/backend.h"
#include "kernels/cpu/mamba_block.h"
#include "kernels/cuda/device_block.h"
#include "kernels/reference/mamba_reference.h"
#include "tests/cuda/block_check.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

using testing::MaxRelErr;
using testing::RelErr;

// f32: every operation rounds at ~6e-8 relative; the scan, GEMMs and reductions sum at most a
// few thousand terms here, so each tensor's relative error stays below 1e-5 unless a term is
// wrong (the CPU f32 engine's worst tensor over this grid is 5e-6, a 2-token dt_proj.bias sum
// with cancellation). bf16 storage rounds every stored activation and weight at 2^-9 = 2e-3
// relative: a few such roundings through the chain rule keep the whole gradient's relative
// error below 2e-2; single small tensors whose terms cancel amplify it, so bf16 is bounded on
// the whole gradient (all tensors as one vector) and each tensor's error is reported.
constexpr double kF32Tol = 1e-5;
constexpr double kBf16Tol = 2e-2;

// ||a - b|| / ||b|| over all tensors of two same-config models at once.
template <typename T, typename U>
double WholeRelErr(const ModelParams<T>& a, const ModelParams<U>& b) {
  double num = 0, den = 0;
  testing::ForEachTensor(a, b, [&](const std::string&, const std::vector<T>& x,
                                   const std::vector<U>& y) {
    for (size_t k = 0; k < x.size(); ++k) {
      num += (double(x[k]) - double(y[k])) * (double(x[k]) - double(y[k]));
      den += double(y[k]) * double(y[k]);
    }
  });
  return std::sqrt(num / den);
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    if (cuda::DeviceCount(&error) == 0) GTEST_SKIP() << "no CUDA device: " << error;
  }
  static Device Gpu(bool bf16) {
    Device d = *ParseDevice("cuda:0");
    d.bf16_storage = bf16;
    return d;
  }
};

MambaConfig TestConfig(int64_t K) { return testing::SmallConfig(K, 16, 8, 4, 3, 29); }

template <typename T>
ModelParams<T> Params(int64_t K) {
  return InitParams<T>(TestConfig(K), 11 + K);
}

// The whole gradient over the grid: K x T x chunk (chunks of 1 row, chunks narrower than the
// conv kernel so halos span several chunks, T not a multiple of the chunk, one chunk).
TEST_F(CudaTest, GradientMatchesCpuF64OverTheGrid) {
  for (int64_t K : {1, 2, 3}) {
    const ModelParams<double> p64 = Params<double>(K);
    const ModelParams<float> p32 = Params<float>(K);
    for (int64_t T : {2, 5, 97, 300}) {
      const std::vector<uint32_t> tokens = testing::RandomTokens(T, 29, 100 + T);
      GradOptions ref_opt;
      ref_opt.chunk = 64;
      absl::StatusOr<GradResult<double>> ref = ComputeGradient<double>(p64, tokens, ref_opt);
      ASSERT_TRUE(ref.ok()) << ref.status();
      for (int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{7}, int64_t{64}, T}) {
        for (bool bf16 : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "K=" << K << " T=" << T << " chunk=" << chunk
                                            << (bf16 ? " bf16" : " f32"));
          GradOptions opt;
          opt.chunk = chunk;
          opt.device = Gpu(bf16);
          absl::StatusOr<GradResult<float>> got = ComputeGradient<float>(p32, tokens, opt);
          ASSERT_TRUE(got.ok()) << got.status();
          std::string worst;
          const double err = MaxRelErr(got->grad, ref->grad, &worst);
          const double whole = WholeRelErr(got->grad, ref->grad);
          // One line per comparison for scripts/gpu-check.sh's report.
          std::printf(
              "[ adjsh-cuda ] K=%lld T=%lld chunk=%lld %s max_rel_err=%.3e (%s) "
              "whole_rel_err=%.3e\n",
              static_cast<long long>(K), static_cast<long long>(T), static_cast<long long>(chunk),
              bf16 ? "bf16" : "f32", err, worst.c_str(), whole);
          if (bf16) {
            EXPECT_LT(whole, kBf16Tol);
          } else {
            EXPECT_LT(err, kF32Tol) << worst;
          }
          EXPECT_NEAR(got->loss, ref->loss, (bf16 ? 1e-2 : 1e-5) * ref->loss);
        }
      }
    }
  }
}

// And against the oracle that keeps every activation (full backprop), at one shape.
TEST_F(CudaTest, GradientMatchesTheOracle) {
  const ModelParams<double> p64 = Params<double>(2);
  const ModelParams<float> p32 = Params<float>(2);
  const std::vector<uint32_t> tokens = testing::RandomTokens(257, 29, 9);
  const auto ref = reference::ReferenceGradient<double>(p64, tokens, 0);
  GradOptions opt;
  opt.chunk = 50;
  opt.device = Gpu(false);
  absl::StatusOr<GradResult<float>> got = ComputeGradient<float>(p32, tokens, opt);
  ASSERT_TRUE(got.ok()) << got.status();
  std::string worst;
  EXPECT_LT(MaxRelErr(got->grad, ref.grad, &worst), kF32Tol) << worst;
}

// Every output of one block's forward and exact backward against the f64 CPU block, at `rows`,
// inputs drawn from `seed`: each output's and the whole gradient's relative error below tol,
// and with f32 storage also each parameter gradient's (with bf16 storage single small tensors
// carry bf16's rounding of the stored rows; the whole gradient is the contract).
void CheckBlockAgainstCpu(const MambaConfig& config, const LayerParams<double>& w64,
                          const LayerParams<float>& w32, cpu::ChunkRows rows, double tol,
                          bool bf16, uint64_t seed) {
  Device gpu = *ParseDevice("cuda:0");
  gpu.bf16_storage = bf16;
  absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(gpu);
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::unique_ptr<BlockBackend<float>> block = (*backend)->MakeBlock(config, w32);
  const testing::BlockCheck c = testing::CheckBlockAgainstCpu(
      config, w64, rows.halo, rows.len, seed,
      [&](const float* u, const float* h0, const float* mu, const float* g,
          testing::BlockRun<float>& out) {
        block->Forward(u, rows, h0, out.y.data(), out.h_end.data());
        block->Backward(u, rows, g, h0, mu, 0, out.grad, out.du.data(), out.du_halo.data(),
                        out.mu_out.data());
      });
  constexpr size_t kOutputs = 5;  // u_next, h_end, du, du_halo, mu_out; then the parameters
  for (size_t q = 0; q < c.names.size(); ++q) {
    if (q >= kOutputs) {
      std::printf("[ adjsh-cuda ] D=%lld N=%lld len=%lld %s%s rel_err=%.3e\n",
                  static_cast<long long>(config.hidden_size),
                  static_cast<long long>(config.state_size), static_cast<long long>(rows.len),
                  c.names[q].c_str(), bf16 ? " bf16" : "", c.errors[q]);
      if (bf16) continue;
    } else if (c.names[q] == "du_halo" && rows.halo == 0) {
      continue;
    }
    EXPECT_LT(c.errors[q], tol) << c.names[q];
  }
  EXPECT_LT(c.grad_whole, tol) << "the layer's whole gradient";
}

// One block, one chunk with halo rows, a non-zero initial state and an incoming adjoint: every
// output of the block interface (u_next, h_end; du, du_halo, mu_out, each parameter's gradient).
TEST_F(CudaTest, BlockMatchesCpuF64WithHaloStateAndAdjoint) {
  const MambaConfig config = TestConfig(1);
  const ModelParams<double> p64 = Params<double>(1);
  const ModelParams<float> p32 = Params<float>(1);
  for (const cpu::ChunkRows rows : {cpu::ChunkRows{3, 37, 0}, cpu::ChunkRows{0, 16, 0},
                                    cpu::ChunkRows{2, 1, 0}}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "halo=" << rows.halo << " len=" << rows.len
                                        << (bf16 ? " bf16" : " f32"));
      CheckBlockAgainstCpu(config, p64.layers[0], p32.layers[0], rows, bf16 ? kBf16Tol : kF32Tol,
                           bf16, rows.len);
    }
  }
}

// The span schedule's chunk summaries through the backend's block (h_local and S of the
// forward, m and S of the adjoint) against the f64 CPU block, one and several scan segments.
TEST_F(CudaTest, SummariesMatchCpuF64) {
  const MambaConfig config = TestConfig(1);
  const ModelParams<double> p64 = Params<double>(1);
  const ModelParams<float> p32 = Params<float>(1);
  for (const cpu::ChunkRows rows : {cpu::ChunkRows{3, 37, 0}, cpu::ChunkRows{2, 300, 0}}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "halo=" << rows.halo << " len=" << rows.len
                                        << (bf16 ? " bf16" : " f32"));
      Device gpu = Gpu(bf16);
      absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(gpu);
      ASSERT_TRUE(backend.ok()) << backend.status();
      std::unique_ptr<BlockBackend<float>> block = (*backend)->MakeBlock(config, p32.layers[0]);
      const testing::SummaryCheck c = testing::CheckSummariesAgainstCpu(
          config, p64.layers[0], rows.halo, rows.len, 17,
          [&](const float* u, const float* g, float* h_local, float* S_fwd, float* m,
              float* S_adj) {
            block->LocalSummary(u, rows, h_local, S_fwd);
            block->AdjointSummary(u, rows, g, m, S_adj);
          });
      std::printf("[ adjsh-cuda ] summaries len=%lld%s h_local=%.3e S=%.3e m=%.3e\n",
                  static_cast<long long>(rows.len), bf16 ? " bf16" : "", c.h_local, c.S_fwd,
                  c.m);
      const double tol = bf16 ? kBf16Tol : kF32Tol;
      EXPECT_LT(c.h_local, tol);
      EXPECT_LT(c.S_fwd, tol);
      EXPECT_LT(c.m, tol);
      EXPECT_LT(c.S_adj, tol);
    }
  }
}

// The span schedule on the GPU: the gradient for S = 1, 2, 5 and 16 spans against the f64 CPU
// engine (one span per chunk at S = 16), and S spans run twice to the same bits.
TEST_F(CudaTest, SpanScheduleMatchesCpuF64ForEverySpanCount) {
  const ModelParams<double> p64 = Params<double>(2);
  const ModelParams<float> p32 = Params<float>(2);
  const std::vector<uint32_t> tokens = testing::RandomTokens(500, 29, 23);
  GradOptions ref_opt;
  ref_opt.chunk = 32;
  absl::StatusOr<GradResult<double>> ref = ComputeGradient<double>(p64, tokens, ref_opt);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (int64_t spans : {1, 2, 5, 16}) {
    GradOptions opt;
    opt.chunk = 32;
    opt.spans = spans;
    opt.device = Gpu(false);
    absl::StatusOr<GradResult<float>> got = ComputeGradient<float>(p32, tokens, opt);
    ASSERT_TRUE(got.ok()) << got.status();
    std::string worst;
    const double err = MaxRelErr(got->grad, ref->grad, &worst);
    std::printf("[ adjsh-cuda ] spans=%lld max_rel_err=%.3e (%s)\n",
                static_cast<long long>(spans), err, worst.c_str());
    EXPECT_LT(err, kF32Tol) << "spans=" << spans << " " << worst;
    EXPECT_NEAR(got->loss, ref->loss, 1e-5 * ref->loss);
    absl::StatusOr<GradResult<float>> again = ComputeGradient<float>(p32, tokens, opt);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(testing::BitwiseEqual(got->grad, again->grad)) << "spans=" << spans;
  }
}

TEST_F(CudaTest, RunToRunBitwiseIdentical) {
  const ModelParams<float> p32 = Params<float>(2);
  const std::vector<uint32_t> tokens = testing::RandomTokens(1000, 29, 4);
  for (bool bf16 : {false, true}) {
    GradOptions opt;
    opt.chunk = 96;
    opt.device = Gpu(bf16);
    absl::StatusOr<GradResult<float>> a = ComputeGradient<float>(p32, tokens, opt);
    absl::StatusOr<GradResult<float>> b = ComputeGradient<float>(p32, tokens, opt);
    opt.threads = 1;  // the thread count only changes the order of independent device calls
    absl::StatusOr<GradResult<float>> c = ComputeGradient<float>(p32, tokens, opt);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(a->loss, b->loss);
    EXPECT_TRUE(testing::BitwiseEqual(a->grad, b->grad)) << (bf16 ? "bf16" : "f32");
    EXPECT_TRUE(testing::BitwiseEqual(a->grad, c->grad)) << (bf16 ? "bf16" : "f32");
  }
}

// The device memory of a gradient is the weights plus workspaces sized by the chunk (and the
// head's fixed row and vocabulary blocks): the same peak for 4x the tokens.
TEST_F(CudaTest, DeviceMemoryIsFlatInT) {
  const ModelParams<float> p32 = Params<float>(2);
  int64_t peaks[2];
  int run = 0;
  for (int64_t T : {int64_t{4096}, int64_t{16384}}) {
    const std::vector<uint32_t> tokens = testing::RandomTokens(T, 29, 5);
    GradOptions opt;
    opt.chunk = 256;
    opt.device = Gpu(false);
    cuda::ResetPeak(0);
    const int64_t before = cuda::MemoryOf(0).held;
    absl::StatusOr<GradResult<float>> g = ComputeGradient<float>(p32, tokens, opt);
    ASSERT_TRUE(g.ok());
    peaks[run++] = cuda::MemoryOf(0).peak - before;
  }
  EXPECT_GT(peaks[0], 0);
  EXPECT_LE(peaks[1], peaks[0]) << "T=4096: " << peaks[0] << " B, T=16384: " << peaks[1] << " B";
}

// The worker's GPU gauges (Backend::MemoryProbe): read from another thread while a block runs,
// every reading has peak >= used; after the run used is what adjsh holds on the device
// (MemoryOf: the block's weights, the workspaces, cuBLAS's) and peak at least the most held
// during it; freeing the block lowers used by its weights but not the peak, which a ResetPeak
// (benchmarks) leaves too; the probe outlives its backend.
TEST_F(CudaTest, MemoryProbeReportsTheBytesHeldDuringARun) {
  absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(Gpu(false));
  ASSERT_TRUE(backend.ok()) << backend.status();
  const DeviceMemoryProbe probe = (*backend)->MemoryProbe();
  ASSERT_TRUE(probe);

  const MambaConfig config = TestConfig(1);
  const ModelParams<float> p32 = Params<float>(1);
  uint64_t weight_bytes = 0;
  for (const auto& slot : LayerParamSlots<float>()) {
    weight_bytes += (p32.layers[0].*slot.member).size() * sizeof(float);
  }
  const int64_t D = config.hidden_size, DiN = config.inner() * config.state_size;
  const cpu::ChunkRows rows{3, 200, 0};
  const std::vector<float> u((rows.halo + rows.len) * D, 0.25f), g(rows.len * D, 0.01f),
      h0(DiN, 0.1f), mu(DiN, 0.02f);
  std::vector<float> y(rows.len * D), h_end(DiN), du(rows.len * D), du_halo(rows.halo * D),
      mu_out(DiN);
  LayerParams<float> grad = ZeroLayer<float>(config);

  std::atomic<bool> running{true};
  std::atomic<int64_t> readings{0}, bad_readings{0};
  std::atomic<uint64_t> most_used_seen{0};
  std::thread scraper([&] {
    while (running.load()) {
      const std::optional<DeviceMemoryUsage> r = probe();
      if (!r || r->peak_bytes < r->used_bytes) bad_readings.fetch_add(1);
      if (r && r->used_bytes > most_used_seen.load()) most_used_seen.store(r->used_bytes);
      readings.fetch_add(1);
    }
  });
  std::unique_ptr<BlockBackend<float>> block = (*backend)->MakeBlock(config, p32.layers[0]);
  for (int rep = 0; rep < 3; ++rep) {
    block->Forward(u.data(), rows, h0.data(), y.data(), h_end.data());
    block->Backward(u.data(), rows, g.data(), h0.data(), mu.data(), 0, grad, du.data(),
                    du_halo.data(), mu_out.data());
  }
  running.store(false);
  scraper.join();
  EXPECT_GT(readings.load(), 0);
  EXPECT_EQ(bad_readings.load(), 0) << "of " << readings.load() << " readings";

  const cuda::DeviceMemory held = cuda::MemoryOf(0);
  const std::optional<DeviceMemoryUsage> after_run = probe();
  ASSERT_TRUE(after_run.has_value());
  EXPECT_GE(after_run->used_bytes, weight_bytes);
  EXPECT_EQ(after_run->used_bytes, static_cast<uint64_t>(held.held));
  EXPECT_GE(after_run->peak_bytes, after_run->used_bytes);
  EXPECT_GE(after_run->peak_bytes, static_cast<uint64_t>(held.peak));
  EXPECT_GE(after_run->peak_bytes, most_used_seen.load());

  block.reset();
  cuda::ResetPeak(0);
  const std::optional<DeviceMemoryUsage> freed = probe();
  ASSERT_TRUE(freed.has_value());
  EXPECT_GE(after_run->used_bytes - freed->used_bytes, weight_bytes);
  EXPECT_EQ(freed->used_bytes, static_cast<uint64_t>(cuda::MemoryOf(0).held));
  EXPECT_EQ(cuda::MemoryOf(0).peak, cuda::MemoryOf(0).held);  // reset for the benchmarks
  EXPECT_GE(freed->peak_bytes, after_run->peak_bytes);        // not for the gauge

  backend->reset();
  const std::optional<DeviceMemoryUsage> later = probe();
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->used_bytes, freed->used_bytes);
  EXPECT_EQ(later->peak_bytes, freed->peak_bytes);
}

// Shapes of the multi-block paths: D = 256, Di = 512 (8 and 16 weight-gradient column blocks;
// scan channel blocks 2 for N = 1, 32 for N = 16, 64 for N = 32), 2003 rows (32 slices of rows,
// 32 scan segments). f32 tolerance: the weight gradients are sums of len terms (GEMMs over the
// rows, the two-stage reductions); of terms of either sign their rounding error relative to the
// sum grows like sqrt(len) 2^-24 to len 2^-24, so the bound is max(1e-5, len 2^-24) (1.2e-4).
TEST_F(CudaTest, BlockMatchesCpuF64AtWideShapes) {
  for (int64_t N : {1, 16, 32}) {
    const MambaConfig config = testing::SmallConfig(1, 256, N, 4, 16, 29);
    const ModelParams<double> p64 = InitParams<double>(config, 40 + N);
    const ModelParams<float> p32 = InitParams<float>(config, 40 + N);
    for (const cpu::ChunkRows rows : {cpu::ChunkRows{3, 2000, 0}, cpu::ChunkRows{0, 5, 0}}) {
      SCOPED_TRACE(::testing::Message() << "N=" << N << " len=" << rows.len);
      const double tol = std::max(kF32Tol, static_cast<double>(rows.len) / (1 << 24));
      CheckBlockAgainstCpu(config, p64.layers[0], p32.layers[0], rows, tol, /*bf16=*/false,
                           rows.len + 7 * N);
    }
  }
}

// The whole gradient with a vocabulary above one head block (V = 8193: the running log-sum-exp
// over two blocks, the second of one entry) and rows above one row block (T = 1500 > 1024).
TEST_F(CudaTest, GradientMatchesCpuF64WithVocabularyAboveOneBlock) {
  const MambaConfig config = testing::SmallConfig(1, 16, 8, 4, 3, 8193);
  const ModelParams<double> p64 = InitParams<double>(config, 50);
  const ModelParams<float> p32 = InitParams<float>(config, 50);
  std::vector<uint32_t> tokens = testing::RandomTokens(1500, 8193, 51);
  tokens[10] = 8192;  // a target in the last block
  GradOptions ref_opt;
  ref_opt.chunk = 256;
  absl::StatusOr<GradResult<double>> ref = ComputeGradient<double>(p64, tokens, ref_opt);
  ASSERT_TRUE(ref.ok()) << ref.status();
  GradOptions opt;
  opt.chunk = 512;
  opt.device = Gpu(false);
  absl::StatusOr<GradResult<float>> got = ComputeGradient<float>(p32, tokens, opt);
  ASSERT_TRUE(got.ok()) << got.status();
  std::string worst;
  const double err = MaxRelErr(got->grad, ref->grad, &worst);
  std::printf("[ adjsh-cuda ] V=8193 T=1500 max_rel_err=%.3e (%s)\n", err, worst.c_str());
  // The head's dE and dw_f sum over 1500 rows: len 2^-24 = 9e-5 bounds them (as above).
  EXPECT_LT(err, 1500.0 / (1 << 24)) << worst;
  EXPECT_NEAR(got->loss, ref->loss, 1e-5 * ref->loss);
}

// One chunk longer than 65535 segments of 64 rows (len > 4,194,240 + : the scan's segments grow
// to 80 rows) with tiny Di and N; every reduction over the rows runs at its largest grid (512
// slices). Tolerance: sums of 4.2M f32 terms, whose rounding error relative to the result is
// about sqrt(len) 2^-24 = 1.2e-4 for terms of either sign: 1e-3 on the whole gradient, each
// tensor's error reported.
TEST_F(CudaTest, LongChunkMatchesCpuF64) {
  const int64_t T = 4200000;
  MambaConfig config = testing::SmallConfig(1, 2, 1, 4, 1, 29);
  const ModelParams<double> p64 = InitParams<double>(config, 60);
  const ModelParams<float> p32 = InitParams<float>(config, 60);
  const std::vector<uint32_t> tokens = testing::RandomTokens(T, 29, 61);
  GradOptions ref_opt;
  ref_opt.chunk = 65536;
  absl::StatusOr<GradResult<double>> ref = ComputeGradient<double>(p64, tokens, ref_opt);
  ASSERT_TRUE(ref.ok()) << ref.status();
  GradOptions opt;
  opt.chunk = T;
  opt.device = Gpu(false);
  absl::StatusOr<GradResult<float>> got = ComputeGradient<float>(p32, tokens, opt);
  ASSERT_TRUE(got.ok()) << got.status();
  std::string worst;
  const double err = MaxRelErr(got->grad, ref->grad, &worst);
  const double whole = WholeRelErr(got->grad, ref->grad);
  std::printf("[ adjsh-cuda ] long chunk T=%lld max_rel_err=%.3e (%s) whole_rel_err=%.3e\n",
              static_cast<long long>(T), err, worst.c_str(), whole);
  EXPECT_LT(whole, 1e-3);
  EXPECT_NEAR(got->loss, ref->loss, 1e-5 * ref->loss);
}

TEST_F(CudaTest, UnsupportedOpsAreRefused) {
  absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(Gpu(false));
  ASSERT_TRUE(backend.ok());
  for (Op op : {Op::kForward, Op::kLocalSummary, Op::kAdjointSummary, Op::kBackwardExact,
                Op::kHead})
    EXPECT_TRUE((*backend)->Supports(op)) << OpName(op);
  for (Op op : {Op::kBackwardTruncated, Op::kHeadAccuracy}) {
    const absl::Status s = (*backend)->Require(op);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(std::string(s.message()).find("not supported on cuda:0"), std::string::npos) << s;
  }
  MambaConfig wide = TestConfig(1);
  wide.state_size = 64;
  EXPECT_EQ((*backend)->CheckConfig(wide).code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace adjsh
