// Evaluation (engine/evaluate.h): its loss is the gradient's loss of the same sequence (f64:
// the same value up to the order of a few thousand additions), for any chunk (halos across
// several chunks, a ragged last chunk) and thread count (bitwise); sequences of a context are
// the mean over their targets; bad input is refused by name.
#include "engine/evaluate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/adjoint_engine.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

double GradLoss(const ModelParams<double>& p, const std::vector<uint32_t>& tokens) {
  GradOptions opt;
  opt.chunk = 16;
  absl::StatusOr<GradResult<double>> g = ComputeGradient<double>(p, tokens, opt);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? g->loss : NAN;
}

// f64: each loss term is exact to ~1e-16 relative and the two sums differ only in order
// (spans and row blocks against chunks and row blocks) over ~1000 terms of one sign: 1e-12.
TEST(EvaluateTest, LossEqualsTheGradientsLossInF64) {
  const MambaConfig config = testing::SmallConfig(3, 8, 4, 4, 2, 29);
  const ModelParams<double> p = InitParams<double>(config, 3);
  const std::vector<uint32_t> ids = testing::RandomTokens(1001, 29, 5);
  const double want = GradLoss(p, ids);
  const TokenData data = TokenData::FromIds(ids);
  double first = 0;
  // 2^40: a chunk far past the sequence is the sequence in one chunk (no 2^40-row buffers).
  for (int64_t chunk : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{64}, int64_t{1001},
                        int64_t{5000}, int64_t{1} << 40}) {
    for (int threads : {1, 2, 3}) {
      EvalOptions opt;
      opt.chunk = chunk;
      opt.threads = threads;
      absl::StatusOr<EvalResult> r = Evaluate<double>(p, data, opt);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->targets, 1000);
      EXPECT_EQ(r->tokens, 1001);
      EXPECT_EQ(r->sequences, 1);
      EXPECT_NEAR(r->loss(), want, 1e-12 * want) << "chunk " << chunk;
      if (threads == 1) first = r->loss_sum;
      EXPECT_EQ(std::memcmp(&first, &r->loss_sum, sizeof first), 0)
          << "chunk " << chunk << " threads " << threads << ": not bitwise the 1-thread sum";
    }
  }
}

// A context cuts the corpus into sequences (the last shorter; a last lone token left out):
// the loss is the targets' mean over all of them, as the gradient's losses give it.
TEST(EvaluateTest, ContextSequencesAndMaxTokens) {
  const MambaConfig config = testing::SmallConfig(2, 8, 4, 4, 2, 29);
  const ModelParams<double> p = InitParams<double>(config, 4);
  const std::vector<uint32_t> ids = testing::RandomTokens(251, 29, 6);
  const TokenData data = TokenData::FromIds(ids);
  EvalOptions opt;
  opt.chunk = 7;
  opt.context = 50;  // 5 sequences of 50, then one lone token
  absl::StatusOr<EvalResult> r = Evaluate<double>(p, data, opt);
  ASSERT_TRUE(r.ok()) << r.status();
  double sum = 0;
  for (int s = 0; s < 5; ++s) {
    const std::vector<uint32_t> seq(ids.begin() + 50 * s, ids.begin() + 50 * (s + 1));
    sum += GradLoss(p, seq) * 49;
  }
  EXPECT_EQ(r->sequences, 5);
  EXPECT_EQ(r->targets, 5 * 49);
  EXPECT_NEAR(r->loss(), sum / (5 * 49), 1e-12 * r->loss());
  opt.max_tokens = 120;  // 50 + 50 + 20
  r = Evaluate<double>(p, data, opt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sequences, 3);
  EXPECT_EQ(r->targets, 49 + 49 + 19);
  const std::vector<uint32_t> last(ids.begin() + 100, ids.begin() + 120);
  EXPECT_NEAR(r->loss_sum - GradLoss(p, last) * 19,
              GradLoss(p, std::vector<uint32_t>(ids.begin(), ids.begin() + 50)) * 49 +
                  GradLoss(p, std::vector<uint32_t>(ids.begin() + 50, ids.begin() + 100)) * 49,
              1e-10);
}

// f32 against f64: the same model's loss within f32's rounding through a few layers.
TEST(EvaluateTest, F32AgreesWithF64) {
  const MambaConfig config = testing::SmallConfig(2, 16, 8, 4, 2, 29);
  const std::vector<uint32_t> ids = testing::RandomTokens(700, 29, 8);
  const TokenData data = TokenData::FromIds(ids);
  EvalOptions opt;
  opt.chunk = 64;
  absl::StatusOr<EvalResult> r64 = Evaluate<double>(InitParams<double>(config, 9), data, opt);
  absl::StatusOr<EvalResult> r32 = Evaluate<float>(InitParams<float>(config, 9), data, opt);
  ASSERT_TRUE(r64.ok() && r32.ok());
  EXPECT_NEAR(r32->loss(), r64->loss(), 1e-5 * r64->loss());
}

TEST(EvaluateTest, BadInputIsRefusedByName) {
  const MambaConfig config = testing::SmallConfig(1, 8, 4, 4, 2, 29);
  const ModelParams<float> p = InitParams<float>(config, 1);
  auto refused = [&](const std::vector<uint32_t>& ids, EvalOptions opt, const char* what) {
    absl::StatusOr<EvalResult> r = Evaluate<float>(p, TokenData::FromIds(ids), opt);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(std::string(r.status().message()).find(what), std::string::npos) << r.status();
  };
  refused({3}, {}, "at least 2 tokens");
  refused({3, 4, 29, 5}, {}, "position 2");
  EvalOptions chunk0;
  chunk0.chunk = 0;
  refused({3, 4}, chunk0, "chunk");
  EvalOptions context1;
  context1.context = 1;
  refused({3, 4}, context1, "context");
  EvalOptions gpu;
  gpu.device = *ParseDevice("cuda:1023");
  absl::StatusOr<EvalResult> r = Evaluate<double>(InitParams<double>(config, 1),
                                                  TokenData::FromIds({1, 2, 3}), gpu);
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace adjsh
