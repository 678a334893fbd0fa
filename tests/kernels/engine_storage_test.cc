// Layer inputs and chunk states stored as bf16 (GradOptions::storage): the gradient stays
// within bf16's rounding of the exact one on every schedule, is as deterministic as f32
// storage, and the stored bytes halve.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/adjoint_engine.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

using testing::MaxRelErr;

// bf16 keeps 8 significand bits: each stored value moves by at most 2^-9 ~ 2e-3 relative.
// Three layers of rounded inputs and states, each feeding the next layer's forward and every
// VJP, stay within a few times that; 2e-2 leaves a margin of about 3x over what is measured
// (7.3e-3 worst per tensor: dt_proj.bias, windowed) while a real defect (a wrong row, a missed
// state) is O(1).
constexpr double kBf16Tolerance = 2e-2;

struct Case {
  Schedule schedule;
  int64_t window;
};

TEST(EngineStorageTest, Bf16StorageIsWithinBf16RoundingOfTheExactGradient) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<float> p32 = InitParams<float>(config, 4);
  const ModelParams<double> p64 = InitParams<double>(config, 4);
  const std::vector<uint32_t> tokens = testing::RandomTokens(700, config.vocab_size, 6);
  for (const Case& k : {Case{Schedule::kSpans, 0}, Case{Schedule::kWavefront, 0}, Case{Schedule::kTwoPass, 0},
                        Case{Schedule::kWavefront, 100}}) {
    GradOptions opt;
    opt.chunk = 64;
    opt.schedule = k.schedule;
    opt.window = k.window;
    const GradResult<double> exact = ComputeGradient<double>(p64, tokens, opt).value();
    const GradResult<float> full = ComputeGradient<float>(p32, tokens, opt).value();
    opt.storage = Storage::kBF16;
    const GradResult<float> bf16 = ComputeGradient<float>(p32, tokens, opt).value();
    std::string worst;
    const double err = MaxRelErr(bf16.grad, exact.grad, &worst);
    EXPECT_LT(err, kBf16Tolerance) << worst << " window " << k.window;
    EXPECT_NEAR(bf16.loss, exact.loss, 1e-2 * exact.loss);
    // The rounding happened: bf16 storage is not the f32 result (f32 is ~1e-6 from exact).
    EXPECT_GT(MaxRelErr(bf16.grad, full.grad), 1e-4);
    EXPECT_LT(MaxRelErr(full.grad, exact.grad), 1e-4);
  }
}

TEST(EngineStorageTest, Bf16StorageWorksWithDoubleCompute) {
  const MambaConfig config = testing::SmallConfig(2, 8, 4, 4, 2, 13);
  const ModelParams<double> params = InitParams<double>(config, 2);
  const std::vector<uint32_t> tokens = testing::RandomTokens(200, config.vocab_size, 3);
  GradOptions opt;
  opt.chunk = 32;
  const GradResult<double> exact = ComputeGradient<double>(params, tokens, opt).value();
  opt.storage = Storage::kBF16;
  const GradResult<double> bf16 = ComputeGradient<double>(params, tokens, opt).value();
  EXPECT_LT(MaxRelErr(bf16.grad, exact.grad), kBf16Tolerance);
  EXPECT_GT(MaxRelErr(bf16.grad, exact.grad), 1e-6);
}

// Thread count and spilling change nothing, bitwise, as with f32 storage.
TEST(EngineStorageTest, Bf16StorageIsDeterministic) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<float> params = InitParams<float>(config, 7);
  const std::vector<uint32_t> tokens = testing::RandomTokens(500, config.vocab_size, 8);
  for (Schedule schedule : {Schedule::kSpans, Schedule::kWavefront, Schedule::kTwoPass}) {
    GradOptions opt;
    opt.chunk = 48;
    opt.schedule = schedule;
    opt.storage = Storage::kBF16;
    opt.threads = 1;
    const GradResult<float> one = ComputeGradient<float>(params, tokens, opt).value();
    opt.threads = 3;
    const GradResult<float> three = ComputeGradient<float>(params, tokens, opt).value();
    opt.spill_dir = ::testing::TempDir();
    const GradResult<float> spilled = ComputeGradient<float>(params, tokens, opt).value();
    EXPECT_EQ(one.loss, three.loss);
    EXPECT_TRUE(testing::BitwiseEqual(one.grad, three.grad));
    EXPECT_EQ(one.loss, spilled.loss);
    EXPECT_TRUE(testing::BitwiseEqual(one.grad, spilled.grad));
  }
}

// The stored layer inputs and chunk states take 2 bytes a value instead of 4.
TEST(EngineStorageTest, Bf16StorageHalvesTheStoredRows) {
  const MambaConfig config = testing::SmallConfig(4, 16, 8, 4, 3, 31);
  const ModelParams<float> params = InitParams<float>(config, 1);
  const int64_t T = 640, C = 64;
  const std::vector<uint32_t> tokens = testing::RandomTokens(T, config.vocab_size, 2);
  GradOptions opt;
  opt.chunk = C;
  opt.schedule = Schedule::kWavefront;  // its stored bytes are the formula below
  const int64_t full = ComputeGradient<float>(params, tokens, opt).value().stored_bytes;
  opt.storage = Storage::kBF16;
  const int64_t half = ComputeGradient<float>(params, tokens, opt).value().stored_bytes;
  const int64_t K = 4, D = 16, DiN = 32 * 8, chunks = T / C;
  EXPECT_EQ(full - half, 2 * K * (T * D + chunks * DiN));
  EXPECT_EQ(full, 4 * (K * (T * D + chunks * DiN) + T * D));
}

TEST(EngineStorageTest, ParsesStorageNames) {
  EXPECT_EQ(ParseStorage("full").value(), Storage::kCompute);
  EXPECT_EQ(ParseStorage("bf16").value(), Storage::kBF16);
  EXPECT_EQ(ParseStorage("f16").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StorageName(Storage::kBF16), "bf16");
  EXPECT_EQ(StorageName(*ParseStorage(StorageName(Storage::kCompute))), "full");
}

}  // namespace
}  // namespace adjsh
