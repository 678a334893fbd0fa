// Decoding (engine/generate.h) against the oracle (kernels/reference): greedy tokens are the
// argmax of p(v | prefix), the oracle's -log p(v | prefix) being the rise of its loss sum when v
// is appended; samples at temperature 1 follow p; a seed fixes the tokens; top-k 1 is greedy.
#include "engine/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/reference/mamba_reference.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

constexpr int64_t kV = 29;

// p(v | prefix) for every v, from the oracle's losses (f64).
std::vector<double> OracleNext(const ModelParams<double>& p, const std::vector<uint32_t>& prefix) {
  std::vector<uint32_t> seq = prefix;
  seq.push_back(0);
  const double before =
      prefix.size() >= 2 ? reference::ReferenceGradient<double>(p, prefix, 0).loss *
                               static_cast<double>(prefix.size() - 1)
                         : 0.0;
  std::vector<double> probs(kV);
  for (int64_t v = 0; v < kV; ++v) {
    seq.back() = static_cast<uint32_t>(v);
    const double after = reference::ReferenceGradient<double>(p, seq, 0).loss *
                         static_cast<double>(seq.size() - 1);
    probs[v] = std::exp(-(after - before));
  }
  return probs;
}

TEST(GenerateTest, GreedyTokensAreTheOraclesMostLikely) {
  const MambaConfig config = testing::SmallConfig(2, 8, 4, 4, 2, kV);
  const ModelParams<double> p = InitParams<double>(config, 21);
  const std::vector<uint32_t> prompt = testing::RandomTokens(7, kV, 3);
  GenerateOptions o;
  o.max_new_tokens = 6;
  o.temperature = 0;
  o.chunk = 3;  // the prompt in several kernel calls, the halo across them
  absl::StatusOr<std::vector<uint32_t>> got = Generate<double>(p, prompt, o);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 6u);
  std::vector<uint32_t> prefix = prompt;
  for (uint32_t id : *got) {
    const std::vector<double> probs = OracleNext(p, prefix);
    double sum = 0;
    for (double q : probs) sum += q;
    EXPECT_NEAR(sum, 1.0, 1e-9) << "the oracle's next-token probabilities";
    const int64_t best = std::max_element(probs.begin(), probs.end()) - probs.begin();
    EXPECT_EQ(id, best) << "after " << prefix.size() << " tokens";
    prefix.push_back(id);
  }
  o.temperature = 1, o.top_k = 1;  // top-1 sampling is greedy
  EXPECT_EQ(*Generate<double>(p, prompt, o), *got);
}

TEST(GenerateTest, SamplesFollowTheModelsDistribution) {
  const MambaConfig config = testing::SmallConfig(1, 8, 4, 4, 2, kV);
  const ModelParams<double> p = InitParams<double>(config, 22);
  const std::vector<uint32_t> prompt = testing::RandomTokens(5, kV, 4);
  const std::vector<double> probs = OracleNext(p, prompt);
  constexpr int kDraws = 4000;
  std::vector<double> freq(kV, 0);
  GenerateOptions o;
  o.max_new_tokens = 1;
  for (int s = 0; s < kDraws; ++s) {
    o.seed = static_cast<uint64_t>(s);
    freq[(*Generate<double>(p, prompt, o))[0]] += 1.0 / kDraws;
  }
  double tv = 0;  // total variation distance; its sampling noise here is about 0.03
  for (int64_t v = 0; v < kV; ++v) tv += std::abs(freq[v] - probs[v]) / 2;
  EXPECT_LT(tv, 0.06);
}

TEST(GenerateTest, ASeedFixesTheTokensAndStopsAndErrorsAreNamed) {
  const MambaConfig config = testing::SmallConfig(2, 8, 4, 4, 2, kV);
  const ModelParams<float> p = InitParams<float>(config, 23);
  const std::vector<uint32_t> prompt = {1, 2, 3};
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.seed = 5;
  const std::vector<uint32_t> a = *Generate<float>(p, prompt, o);
  EXPECT_EQ(*Generate<float>(p, prompt, o), a);
  o.seed = 6;
  EXPECT_NE(*Generate<float>(p, prompt, o), a);
  o.seed = 5, o.stop_id = a[3];
  const std::vector<uint32_t> stopped = *Generate<float>(p, prompt, o);
  ASSERT_LE(stopped.size(), 4u);
  EXPECT_EQ(stopped.back(), a[3]);
  int calls = 0;
  o.stop_id = -1;
  EXPECT_EQ(Generate<float>(p, prompt, o, [&](uint32_t) { return ++calls < 2; })->size(), 2u);
  EXPECT_EQ(Generate<float>(p, {}, o).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> bad = {1, 29};
  EXPECT_EQ(Generate<float>(p, bad, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.stop_id = kV;  // never drawn: refused, not ignored
  const absl::Status stop = Generate<float>(p, prompt, o).status();
  EXPECT_EQ(stop.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(stop.message()).find("stop id"), std::string::npos) << stop;
  o.stop_id = kV - 1;
  EXPECT_TRUE(Generate<float>(p, prompt, o).ok());
  o.temperature = -1;
  EXPECT_EQ(Generate<float>(p, prompt, o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adjsh
