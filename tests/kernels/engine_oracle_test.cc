// The adjoint engine against the in-repo oracle (full backprop keeping every activation), in
// f64, over the grid K x T x chunk x window. Any difference beyond rounding is a bug: the
// engine's chunk combines and truncated scan are exact rearrangements of the same sums, so the
// bound 1e-10 is many orders above f64 rounding (~1e-15 per operation) and far below any error.
#include <gtest/gtest.h>

#include <tuple>

#include "engine/adjoint_engine.h"
#include "engine/span_plan.h"
#include "kernels/reference/mamba_reference.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

using testing::MaxRelErr;

class EngineOracleTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(EngineOracleTest, MatchesOracleInF64) {
  const auto [K, T] = GetParam();
  const MambaConfig config = testing::SmallConfig(K);
  const ModelParams<double> params = InitParams<double>(config, 7 + K);
  const std::vector<uint32_t> tokens = testing::RandomTokens(T, config.vocab_size, 100 + T);
  for (int64_t window : {0, 1, 8, T}) {
    const auto ref = reference::ReferenceGradient<double>(params, tokens, window);
    for (int64_t chunk : {1, 7, 64, T})
    for (Schedule schedule : {Schedule::kSpans, Schedule::kWavefront, Schedule::kTwoPass})
    for (int64_t spans : {0, 1, 2, 3, 1000}) {
      const int64_t chunks = (T + chunk - 1) / chunk;
      if (schedule != Schedule::kSpans && spans != 0) continue;
      if (spans == 1000) spans = chunks;  // one span per chunk
      if (!SpanPlan::Make(T, chunk, spans, K, config.conv_kernel).ok()) continue;
      SCOPED_TRACE(::testing::Message() << "K=" << K << " T=" << T << " window=" << window
                                        << " chunk=" << chunk << " schedule="
                                        << static_cast<int>(schedule) << " spans=" << spans);
      GradOptions opt;
      opt.chunk = chunk;
      opt.schedule = schedule;
      opt.spans = spans;
      opt.window = window;
      opt.threads = 2;
      absl::StatusOr<GradResult<double>> got = ComputeGradient<double>(params, tokens, opt);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_NEAR(got->loss, ref.loss, 1e-12 * std::abs(ref.loss));
      std::string worst;
      EXPECT_LT(MaxRelErr(got->grad, ref.grad, &worst), 1e-10) << worst;
    }
  }
}

// An untied LM head (lm_head.weight): every schedule's gradient equals the oracle's, the head's
// gradient its own and the embedding's the lookups' alone (so not the tied model's).
TEST(EngineUntiedHeadTest, MatchesOracleInF64) {
  MambaConfig config = testing::SmallConfig(2);
  config.tie_word_embeddings = false;
  const ModelParams<double> params = InitParams<double>(config, 21);
  const std::vector<uint32_t> tokens = testing::RandomTokens(97, config.vocab_size, 5);
  const auto ref = reference::ReferenceGradient<double>(params, tokens, 0);
  ASSERT_EQ(ref.grad.lm_head.size(), params.embed.size());
  ModelParams<double> tied = params;
  tied.config.tie_word_embeddings = true;
  tied.lm_head.clear();
  const auto ref_tied = reference::ReferenceGradient<double>(tied, tokens, 0);
  EXPECT_GT(testing::RelErr(ref.grad.embed, ref_tied.grad.embed), 1e-3);
  for (Schedule schedule : {Schedule::kSpans, Schedule::kWavefront, Schedule::kTwoPass})
    for (int64_t chunk : {7, 97}) {
      SCOPED_TRACE(::testing::Message() << "schedule " << static_cast<int>(schedule)
                                        << " chunk " << chunk);
      GradOptions opt;
      opt.chunk = chunk;
      opt.schedule = schedule;
      opt.spans = schedule == Schedule::kSpans && chunk == 7 ? 3 : 0;
      opt.threads = 2;
      absl::StatusOr<GradResult<double>> got = ComputeGradient<double>(params, tokens, opt);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_NEAR(got->loss, ref.loss, 1e-12 * std::abs(ref.loss));
      ASSERT_EQ(got->grad.lm_head.size(), params.embed.size());
      std::string worst;
      EXPECT_LT(MaxRelErr(got->grad, ref.grad, &worst), 1e-10) << worst;
    }
}

INSTANTIATE_TEST_SUITE_P(Grid, EngineOracleTest,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Values(2, 5, 97, 300)));

// The window only cuts the adjoint: a window covering the whole sequence is the exact gradient,
// and a short one differs from it (so the truncated path is really taken).
TEST(EngineWindowTest, FullWindowIsExactAndShortWindowIsNot) {
  const MambaConfig config = testing::SmallConfig(2);
  const ModelParams<double> params = InitParams<double>(config, 3);
  const std::vector<uint32_t> tokens = testing::RandomTokens(120, config.vocab_size, 5);
  GradOptions exact;
  exact.chunk = 16;
  auto g_exact = ComputeGradient<double>(params, tokens, exact);
  ASSERT_TRUE(g_exact.ok());
  GradOptions full = exact;
  full.window = 1000;
  auto g_full = ComputeGradient<double>(params, tokens, full);
  ASSERT_TRUE(g_full.ok());
  EXPECT_LT(MaxRelErr(g_full->grad, g_exact->grad), 1e-12);
  GradOptions cut = exact;
  cut.window = 4;
  auto g_cut = ComputeGradient<double>(params, tokens, cut);
  ASSERT_TRUE(g_cut.ok());
  EXPECT_GT(MaxRelErr(g_cut->grad, g_exact->grad), 1e-6);
  EXPECT_EQ(g_cut->loss, g_exact->loss);  // forward values are unchanged
}

// f32 engine (fast exp, BLAS) against the f64 oracle: f32 rounding (~6e-8 per operation,
// accumulated over sums of up to T * Di terms) keeps the relative error well below 1e-4.
TEST(EngineOracleF32Test, MatchesF64OracleWithinF32Rounding) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 29);
  const ModelParams<double> p64 = InitParams<double>(config, 11);
  const ModelParams<float> p32 = InitParams<float>(config, 11);
  const std::vector<uint32_t> tokens = testing::RandomTokens(257, config.vocab_size, 9);
  for (int64_t window : {0, 16}) {
    const auto ref = reference::ReferenceGradient<double>(p64, tokens, window);
    GradOptions opt;
    opt.chunk = 50;
    opt.window = window;
    auto got = ComputeGradient<float>(p32, tokens, opt);
    ASSERT_TRUE(got.ok());
    std::string worst_name;
    const double worst = MaxRelErr(got->grad, ref.grad, &worst_name);
    EXPECT_LT(worst, 1e-4) << worst_name << " window=" << window;
    EXPECT_NEAR(got->loss, ref.loss, 1e-5 * ref.loss);
  }
}

}  // namespace
}  // namespace adjsh
