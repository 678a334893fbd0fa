// Properties of the adjoint engine that need no oracle: agreement with central finite
// differences, independence of chunk size and thread count, input validation, real shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/adjoint_engine.h"
#include "engine/gradient_step.h"
#include "engine/spill_buffer.h"
#include "kernels/cpu/kept_pool.h"
#include "kernels/cpu/mamba_block.h"
#include "kernels/reference/mamba_reference.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

using testing::MaxRelErr;

double Loss(const ModelParams<double>& p, const std::vector<uint32_t>& tokens) {
  GradOptions opt;
  opt.chunk = 4;
  opt.threads = 1;
  return ComputeGradient<double>(p, tokens, opt).value().loss;
}

// Fourth-order central differences in f64, step h = 1e-4: truncation error ~h^4 |L^(5)| ~ 1e-16
// and rounding ~eps |L| / h ~ 1e-11 absolute, far below the 1e-6 relative bound for gradients of
// norm >= 1e-5 (the weights are scaled up from the default init so that every path, the SSM's
// Delta, B, C and A among them, carries a gradient that large). Every element of every tensor.
TEST(EngineFiniteDifferenceTest, EveryParameterMatchesCentralDifferences) {
  MambaConfig config = testing::SmallConfig(2, 4, 3, 3, 2, 7);
  ModelParams<double> params = InitParams<double>(config, 21);
  for (auto& layer : params.layers) {
    for (double& w : layer.in_proj) w *= 10;
    for (double& w : layer.x_proj) w *= 20;
    for (double& w : layer.dt_w) w *= 50;
    for (double& b : layer.dt_b) b += 3.0;
    for (double& w : layer.out_proj) w *= 10;
  }
  const std::vector<uint32_t> tokens = testing::RandomTokens(11, config.vocab_size, 4);
  GradOptions opt;
  opt.chunk = 4;  // several chunks and conv halos
  const GradResult<double> got = ComputeGradient<double>(params, tokens, opt).value();

  ModelParams<double> fd = ZeroParams<double>(config);
  const double h = 1e-4;
  auto diff = [&](std::vector<double>& values, std::vector<double>& out) {
    for (size_t k = 0; k < values.size(); ++k) {
      const double saved = values[k];
      auto at = [&](double step) {
        values[k] = saved + step;
        return Loss(params, tokens);
      };
      out[k] = (at(-2 * h) - 8 * at(-h) + 8 * at(h) - at(2 * h)) / (12 * h);
      values[k] = saved;
    }
  };
  diff(params.embed, fd.embed);
  diff(params.norm_f, fd.norm_f);
  for (size_t k = 0; k < params.layers.size(); ++k)
    for (const auto& slot : LayerParamSlots<double>())
      diff(params.layers[k].*slot.member, fd.layers[k].*slot.member);
  testing::ForEachTensor(got.grad, fd, [&](const std::string& name, const auto& g, const auto& f) {
    double norm = 0;
    for (double v : g) norm += v * v;
    EXPECT_GT(std::sqrt(norm), 1e-5) << name << ": too small to be checked by differences";
    EXPECT_LT(testing::RelErr(g, f), 1e-6) << name;
  });
}

// Chunking and threading rearrange exact sums: f64 results agree to 1e-12 relative, and for a
// fixed chunk size the result is bitwise identical for any thread count.
TEST(EngineDeterminismTest, IndependentOfChunkAndThreads) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<double> params = InitParams<double>(config, 5);
  const std::vector<uint32_t> tokens = testing::RandomTokens(500, config.vocab_size, 8);
  GradOptions base;
  base.chunk = 500;
  base.threads = 1;
  const GradResult<double> ref = ComputeGradient<double>(params, tokens, base).value();
  for (int64_t chunk : {1, 3, 64, 100}) {
    for (int threads : {1, 2, 3, 5}) {
      for (Schedule schedule : {Schedule::kWavefront, Schedule::kTwoPass}) {
        GradOptions opt = base;
        opt.chunk = chunk;
        opt.threads = threads;
        opt.schedule = schedule;
        const GradResult<double> got = ComputeGradient<double>(params, tokens, opt).value();
        EXPECT_LT(MaxRelErr(got.grad, ref.grad), 1e-12)
            << "chunk " << chunk << " threads " << threads << " schedule " << int(schedule);
      }
    }
  }
  for (auto [window, schedule] : {std::pair{int64_t{0}, Schedule::kWavefront},
                                  std::pair{int64_t{0}, Schedule::kTwoPass},
                                  std::pair{int64_t{37}, Schedule::kWavefront}}) {
    GradOptions one = base;
    one.chunk = 64;
    one.window = window;
    one.schedule = schedule;
    const GradResult<float> a =
        ComputeGradient<float>(InitParams<float>(config, 5), tokens, one).value();
    for (int threads : {2, 4}) {
      GradOptions many = one;
      many.threads = threads;
      const GradResult<float> b =
          ComputeGradient<float>(InitParams<float>(config, 5), tokens, many).value();
      EXPECT_EQ(a.loss, b.loss);
      EXPECT_EQ(MaxRelErr(a.grad, b.grad), 0.0) << "threads " << threads << " window " << window;
    }
  }
}

// The wavefront carries each chunk's forward to its backward task as the kept budget allows
// (engine/gradient_step.h): no bit changes, whatever is carried (every set, a few, none), for
// either storage, any thread count, with a loss mask or without, with few chunks or with more
// than one group of chunks per partial (35 chunks of 20), with tapered chunks (C = 256: 64, 192,
// 256, 64 and 124 rows); every set carried is taken.
TEST(EngineWavefrontTest, CarriedActivationsDoNotChangeTheBits) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<float> params = InitParams<float>(config, 11);
  const std::vector<uint32_t> tokens = testing::RandomTokens(700, config.vocab_size, 12);
  const std::vector<uint8_t> mask = testing::EveryThirdLeftOut(tokens.size());
  const int64_t K = config.num_hidden_layers;
  const cpu::MambaBlockCpu<float> block(config, params.layers[0]);
  struct Case {
    int64_t chunk;
    Storage storage;
    bool masked;
  };
  std::vector<Case> cases;
  for (int64_t chunk : {50, 20, 256})
    for (Storage storage : {Storage::kCompute, Storage::kBF16})
      for (bool masked : {false, true}) cases.push_back({chunk, storage, masked});
  for (const Case& c : cases) {
    const int64_t rows = 700 * K, few = 2 * block.SetBytes({3, std::min<int64_t>(c.chunk, 64), 0});
    GradOptions opt;
    opt.chunk = c.chunk;
    opt.schedule = Schedule::kWavefront;
    opt.storage = c.storage;
    opt.threads = 1;
    if (c.masked) opt.loss_mask = mask;
    opt.device.kept_budget = 0;
    const GradResult<float> none = ComputeGradient<float>(params, tokens, opt).value();
    for (int64_t budget : {few, int64_t{256} << 20})
      for (int threads : {1, 2, 3}) {
        opt.device.kept_budget = budget;  // the step's backend keeps in the store of it
        const std::shared_ptr<cpu::KeptStore> store = cpu::KeptStore::Shared(budget);
        opt.threads = threads;
        const cpu::KeptTakes was = store->takes();
        const GradResult<float> got = ComputeGradient<float>(params, tokens, opt).value();
        const cpu::KeptTakes now = store->takes();
        const int64_t carried = now.carried_rows - was.carried_rows;
        EXPECT_EQ(now.carried_to_summary, was.carried_to_summary);
        const std::string what =
            "chunk " + std::to_string(c.chunk) + ", storage " +
            std::string(StorageName(c.storage)) + ", budget " + std::to_string(budget) +
            ", threads " + std::to_string(threads) + (c.masked ? ", masked" : "");
        EXPECT_EQ(std::memcmp(&got.loss, &none.loss, sizeof(double)), 0) << what;
        EXPECT_TRUE(testing::BitwiseEqual(got.grad, none.grad)) << what;
        EXPECT_EQ(got.correct, none.correct) << what;
        EXPECT_EQ(got.targets, none.targets) << what;
        if (budget == few) {
          EXPECT_GT(carried, 0) << what;
          EXPECT_LT(carried, rows) << what;
        } else {
          EXPECT_EQ(carried, rows) << what;
        }
        EXPECT_EQ(store->carried_bytes(), 0) << "a carried set outlived its step; " << what;
      }
  }
}

// The wavefront's graph cuts C / 4 rows off each end when C is a multiple of 256
// (engine/gradient_step.h ChunkStarts); the other schedules, and other chunk sizes, every C.
TEST(EngineWavefrontTest, ChunksTaperAtBothEnds) {
  using Step = GradientStep<float>;
  EXPECT_EQ(Step::ChunkStarts(1024, 256, true), (std::vector<int64_t>{0, 64, 256, 512, 768, 960, 1024}));
  EXPECT_EQ(Step::ChunkStarts(700, 256, true), (std::vector<int64_t>{0, 64, 256, 512, 576, 700}));
  EXPECT_EQ(Step::ChunkStarts(512, 256, true), (std::vector<int64_t>{0, 64, 256, 448, 512}));
  EXPECT_EQ(Step::ChunkStarts(1100, 512, true), (std::vector<int64_t>{0, 128, 512, 960, 1100}));
  EXPECT_EQ(Step::ChunkStarts(1025, 256, true), (std::vector<int64_t>{0, 64, 256, 512, 768, 960, 1025}));
  EXPECT_EQ(Step::ChunkStarts(511, 256, true), (std::vector<int64_t>{0, 256, 511}));
  EXPECT_EQ(Step::ChunkStarts(1024, 256, false), (std::vector<int64_t>{0, 256, 512, 768, 1024}));
  EXPECT_EQ(Step::ChunkStarts(700, 100, true),
            (std::vector<int64_t>{0, 100, 200, 300, 400, 500, 600, 700}));
}

// Tapered chunks give the exact gradient: the wavefront at C = 256 against the oracle, in f64;
// at T = 4300 the backward adds two groups of partials (kChunksPerPartial C = 4096 rows), the
// second of two chunks (128 and 76 rows).
TEST(EngineWavefrontTest, TaperedChunksMatchTheOracleInF64) {
  const MambaConfig config = testing::SmallConfig(2);
  const ModelParams<double> params = InitParams<double>(config, 17);
  for (int64_t T : {700, 4300}) {
    const std::vector<uint32_t> tokens = testing::RandomTokens(T, config.vocab_size, 18);
    const auto ref = reference::ReferenceGradient<double>(params, tokens, 0);
    GradOptions opt;
    opt.chunk = 256;
    opt.schedule = Schedule::kWavefront;
    opt.threads = 2;
    const GradResult<double> got = ComputeGradient<double>(params, tokens, opt).value();
    EXPECT_NEAR(got.loss, ref.loss, 1e-12 * std::abs(ref.loss)) << "T = " << T;
    std::string worst;
    EXPECT_LT(MaxRelErr(got.grad, ref.grad, &worst), 1e-10) << "T = " << T << ": " << worst;
  }
}

// Layer inputs spilled to memory-mapped files: the same numbers, bitwise.
TEST(EngineSpillTest, SpilledRowsGiveTheSameGradient) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<float> params = InitParams<float>(config, 4);
  const std::vector<uint32_t> tokens = testing::RandomTokens(700, config.vocab_size, 6);
  GradOptions opt;
  opt.chunk = 64;
  const GradResult<float> heap = ComputeGradient<float>(params, tokens, opt).value();
  opt.spill_dir = ::testing::TempDir();
  const GradResult<float> spilled = ComputeGradient<float>(params, tokens, opt).value();
  EXPECT_EQ(heap.loss, spilled.loss);
  EXPECT_EQ(MaxRelErr(heap.grad, spilled.grad), 0.0);
  absl::StatusOr<SpillBuffer<float>> rows = SpillBuffer<float>::Create(1000, ::testing::TempDir());
  ASSERT_TRUE(rows.ok());
  EXPECT_TRUE(rows->spilled());
  opt.spill_dir = "/nonexistent/dir";
  EXPECT_EQ(ComputeGradient<float>(params, tokens, opt).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EngineInputTest, RejectsBadInputWithClearErrors) {
  const MambaConfig config = testing::SmallConfig(1);
  const ModelParams<float> params = InitParams<float>(config, 1);
  GradOptions opt;
  auto one = ComputeGradient<float>(params, std::vector<uint32_t>{3}, opt);
  EXPECT_EQ(one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(one.status().message().find("at least 2"), std::string::npos);
  auto empty = ComputeGradient<float>(params, std::vector<uint32_t>{}, opt);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto oov = ComputeGradient<float>(params, std::vector<uint32_t>{1, 2, 13, 4}, opt);
  EXPECT_EQ(oov.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(oov.status().message().find("position 2"), std::string::npos) << oov.status();
  GradOptions bad_chunk;
  bad_chunk.chunk = 0;
  EXPECT_EQ(ComputeGradient<float>(params, std::vector<uint32_t>{1, 2}, bad_chunk).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The shapes of state-spaces/mamba-130m-hf (synthetic weights): D=768, K=24, N=16, R=48,
// V=50280. A short sequence across several chunks; every gradient finite and non-zero, and
// the loss near log(V) for a fresh model.
TEST(EngineRealShapesTest, Mamba130mShapes) {
  MambaConfig config;
  config.hidden_size = 768;
  config.num_hidden_layers = 24;
  config.state_size = 16;
  config.conv_kernel = 4;
  config.expand = 2;
  config.time_step_rank = 48;
  config.vocab_size = 50280;
  const ModelParams<float> params = InitParams<float>(config, 1);
  const std::vector<uint32_t> tokens = testing::RandomTokens(40, config.vocab_size, 2);
  GradOptions opt;
  opt.chunk = 16;
  const GradResult<float> got = ComputeGradient<float>(params, tokens, opt).value();
  EXPECT_NEAR(got.loss, std::log(50280.0), 1.0);
  testing::ForEachTensor(got.grad, got.grad, [&](const std::string& name, const auto& g,
                                                 const auto&) {
    double norm = 0;
    for (float v : g) norm += double(v) * v;
    EXPECT_TRUE(std::isfinite(norm) && norm > 0) << name << " norm " << norm;
  });
}

}  // namespace
}  // namespace adjsh
