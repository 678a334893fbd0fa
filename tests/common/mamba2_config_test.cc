// common/mamba2_config.h: config.json of Mamba2ForCausalLM read and written back.
#include "common/mamba2_config.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace adjsh {
namespace {

using ::adjsh::testing::StatusIs;

constexpr char kConfig[] = R"({
  "model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2, "state_size": 16,
  "expand": 2, "head_dim": 16, "num_heads": 8, "n_groups": 2, "vocab_size": 100,
  "time_step_limit": [0.0, Infinity], "norm_before_gate": true, "eos_token_id": 7,
  "tie_word_embeddings": true
})";

TEST(Mamba2ConfigTest, ReadsTransformersJsonAndWritesItBack) {
  absl::StatusOr<Mamba2Config> c = ParseMamba2ConfigJson(kConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->inner(), 128);
  EXPECT_EQ(c->conv_channels(), 128 + 2 * 2 * 16);
  EXPECT_EQ(c->in_proj_rows(), 2 * 128 + 2 * 2 * 16 + 8);
  EXPECT_TRUE(std::isinf(c->time_step_max_limit));
  EXPECT_FALSE(c->dt_clamped());
  EXPECT_EQ(c->conv_kernel, 4);  // absent: transformers' default
  const std::string back = Mamba2ConfigToJson(*c);
  EXPECT_NE(back.find("Infinity"), std::string::npos) << back;
  EXPECT_NE(back.find("\"norm_before_gate\": true"), std::string::npos) << back;
  EXPECT_NE(back.find("\"eos_token_id\": 7"), std::string::npos) << back;
  absl::StatusOr<Mamba2Config> again = ParseMamba2ConfigJson(back);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Mamba2ConfigToJson(*again), back);
  EXPECT_EQ(ModelTypeOf(kConfig).value(), "mamba2");
}

TEST(Mamba2ConfigTest, SizesThatDoNotAgreeAreRefusedByKey) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string s = kConfig;
    s.replace(s.find(from), from.size(), to);
    return ParseMamba2ConfigJson(s).status();
  };
  EXPECT_TRUE(StatusIs(with("\"num_heads\": 8", "\"num_heads\": 6"),
                       absl::StatusCode::kInvalidArgument, "num_heads x head_dim"));
  EXPECT_TRUE(StatusIs(with("\"n_groups\": 2", "\"n_groups\": 3"),
                       absl::StatusCode::kInvalidArgument, "does not divide num_heads"));
  EXPECT_TRUE(StatusIs(with("[0.0, Infinity]", "[0.1, 0.05]"),
                       absl::StatusCode::kInvalidArgument, "time_step_limit"));
  EXPECT_TRUE(StatusIs(with("[0.0, Infinity]", "\"wide\""),
                       absl::StatusCode::kInvalidArgument, "time_step_limit"));
  EXPECT_TRUE(StatusIs(with("\"mamba2\"", "\"mamba\""), absl::StatusCode::kInvalidArgument,
                       "model_type"));
  EXPECT_TRUE(StatusIs(with("\"expand\": 2", "\"expand\": 2, \"rms_norm\": false"),
                       absl::StatusCode::kInvalidArgument, "rms_norm"));
  absl::StatusOr<Mamba2Config> clamped = ParseMamba2ConfigJson(
      std::string(kConfig).replace(std::string(kConfig).find("[0.0, Infinity]"), 15,
                                   "[0.001, 0.1]"));
  ASSERT_TRUE(clamped.ok()) << clamped.status();
  EXPECT_TRUE(clamped->dt_clamped());
}

}  // namespace
}  // namespace adjsh
