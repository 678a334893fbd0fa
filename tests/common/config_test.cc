// config.json parsing and validation, in the Hugging Face MambaConfig spelling.
#include "common/config.h"

#include <string>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace adjsh {
namespace {

using ::adjsh::testing::IsInvalid;
using ::adjsh::testing::ScratchDir;
using ::adjsh::testing::StatusIs;
using Json = nlohmann::json;

// As published with state-spaces/mamba-130m-hf (transformers' MambaConfig keys).
constexpr const char* kMamba130m = R"({
  "architectures": ["MambaForCausalLM"],
  "bos_token_id": 0,
  "conv_kernel": 4,
  "eos_token_id": 0,
  "expand": 2,
  "fused_add_norm": true,
  "hidden_act": "silu",
  "hidden_size": 768,
  "initializer_range": 0.1,
  "intermediate_size": 1536,
  "layer_norm_epsilon": 1e-05,
  "model_type": "mamba",
  "n_layer": 24,
  "num_hidden_layers": 24,
  "pad_token_id": 0,
  "pad_vocab_size_multiple": 8,
  "rescale_prenorm_residual": false,
  "residual_in_fp32": true,
  "rms_norm": true,
  "state_size": 16,
  "time_step_floor": 0.0001,
  "time_step_init_scheme": "random",
  "time_step_max": 0.1,
  "time_step_min": 0.001,
  "time_step_rank": 48,
  "time_step_scale": 1.0,
  "torch_dtype": "float32",
  "transformers_version": "4.39.0.dev0",
  "use_bias": false,
  "use_cache": true,
  "use_conv_bias": true,
  "vocab_size": 50280
})";

TEST(ConfigTest, ParsesMamba130m) {
  absl::StatusOr<MambaConfig> c = ParseConfigJson(kMamba130m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 768);
  EXPECT_EQ(c->num_hidden_layers, 24);
  EXPECT_EQ(c->state_size, 16);
  EXPECT_EQ(c->conv_kernel, 4);
  EXPECT_EQ(c->expand, 2);
  EXPECT_EQ(c->inner(), 1536);
  EXPECT_EQ(c->time_step_rank, 48);
  EXPECT_EQ(c->vocab_size, 50280);
  EXPECT_DOUBLE_EQ(c->layer_norm_epsilon, 1e-5);
  EXPECT_FALSE(c->use_bias);
  EXPECT_TRUE(c->use_conv_bias);
  EXPECT_TRUE(c->tie_word_embeddings);  // HF default when the key is absent
}

TEST(ConfigTest, DefaultsAndAutoRank) {
  absl::StatusOr<MambaConfig> c =
      ParseConfigJson(R"({"hidden_size": 100, "num_hidden_layers": 2, "vocab_size": 7})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->time_step_rank, 7);  // absent = "auto" = ceil(100 / 16)
  EXPECT_EQ(c->state_size, 16);
  EXPECT_EQ(c->conv_kernel, 4);
  EXPECT_EQ(c->expand, 2);
  EXPECT_DOUBLE_EQ(c->layer_norm_epsilon, 1e-5);
  c = ParseConfigJson(
      R"({"hidden_size": 96, "num_hidden_layers": 2, "vocab_size": 7, "time_step_rank": "auto"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->time_step_rank, 6);
  c = ParseConfigJson(
      R"({"hidden_size": 97, "num_hidden_layers": 2, "vocab_size": 7, "time_step_rank": "auto"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->time_step_rank, 7);
}

// kMamba130m with one key replaced (or removed when value is "<remove>").
std::string With(const std::string& key, const std::string& value_json) {
  Json j = Json::parse(kMamba130m);
  if (value_json == "<remove>") {
    j.erase(key);
  } else {
    j[key] = Json::parse(value_json);
  }
  return j.dump();
}

TEST(ConfigTest, InvalidValuesNameTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"hidden_size", "<remove>"},       {"num_hidden_layers", "<remove>"},
      {"vocab_size", "<remove>"},        {"hidden_size", "0"},
      {"hidden_size", "-768"},           {"hidden_size", "768.5"},
      {"hidden_size", "\"768\""},        {"hidden_size", "100000"},
      {"hidden_size", "18446744073709551615"}, {"hidden_size", "9223372036854775807"},
      {"num_hidden_layers", "0"},        {"num_hidden_layers", "2000"},
      {"state_size", "0"},               {"state_size", "4096"},
      {"conv_kernel", "0"},              {"conv_kernel", "65"},
      {"expand", "0"},                   {"expand", "17"},
      {"time_step_rank", "0"},           {"time_step_rank", "\"Auto\""},
      {"time_step_rank", "null"},        {"time_step_rank", "4.5"},
      {"vocab_size", "0"},               {"vocab_size", "4294967296"},
      {"layer_norm_epsilon", "0"},       {"layer_norm_epsilon", "-1e-5"},
      {"layer_norm_epsilon", "\"1e-5\""},
      {"use_bias", "true"},              {"use_bias", "0"},
      {"use_conv_bias", "false"},        {"tie_word_embeddings", "\"yes\""},
      {"intermediate_size", "1000"},
      {"intermediate_size", "\"x\""},
  };
  for (const auto& [key, value] : cases) {
    EXPECT_TRUE(IsInvalid(ParseConfigJson(With(key, value)), "\"" + key + "\""))
        << key << " = " << value;
  }
  // The message says what the key holds, once: a null is "null", not "null null".
  EXPECT_EQ(ParseConfigJson(With("hidden_size", "null")).status().message(),
            "config key \"hidden_size\": must be an integer, got null");
  EXPECT_TRUE(IsInvalid(ParseConfigJson(With("hidden_size", "\"768\"")),
                        "must be an integer, got string \"768\""));
  // "auto" rank with the largest int64 width must not overflow.
  EXPECT_TRUE(IsInvalid(ParseConfigJson(R"({"hidden_size": 9223372036854775807,
      "num_hidden_layers": 2, "vocab_size": 7})"), "hidden_size"));
  // Unsupported features say so.
  EXPECT_TRUE(IsInvalid(ParseConfigJson(With("use_bias", "true")), "adjsh supports"));
  // An untied LM head is supported (its own lm_head.weight, common/model.h).
  const absl::StatusOr<MambaConfig> untied = ParseConfigJson(With("tie_word_embeddings", "false"));
  ASSERT_TRUE(untied.ok()) << untied.status();
  EXPECT_FALSE(untied->tie_word_embeddings);
}

TEST(ConfigTest, ValidateRejectsNonFiniteEpsilon) {
  MambaConfig c = *ParseConfigJson(kMamba130m);
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.layer_norm_epsilon = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(IsInvalid(ValidateConfig(c), "layer_norm_epsilon"));
  c.layer_norm_epsilon = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(IsInvalid(ValidateConfig(c), "layer_norm_epsilon"));
}

TEST(ConfigTest, NotJsonOrNotObject) {
  EXPECT_TRUE(IsInvalid(ParseConfigJson("{"), "not valid JSON"));
  EXPECT_TRUE(IsInvalid(ParseConfigJson("[]"), "not a JSON object"));
  EXPECT_TRUE(IsInvalid(ParseConfigJson(""), "not valid JSON"));
}

// config.json as Python's json module writes it: Infinity, -Infinity and NaN are read (a
// Mamba-2 config's time_step_limit is [0.0, Infinity]) and written back as the same words;
// the same words inside strings are left alone.
TEST(ConfigTest, ReadsAndWritesPythonsInfinityAndNaN) {
  const std::string text = R"({"hidden_size": 16, "num_hidden_layers": 2, "vocab_size": 7,
      "time_step_limit": [0.0, Infinity], "lo": -Infinity, "odd": NaN,
      "note": "Infinity and NaN in a string", "quote": "a \"NaN\" quoted"})";
  absl::StatusOr<MambaConfig> c = ParseConfigJson(text);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string out = ConfigToJson(*c);
  EXPECT_NE(out.find("Infinity\n"), std::string::npos) << out;  // the list's last value
  EXPECT_NE(out.find("\"lo\": -Infinity"), std::string::npos) << out;
  EXPECT_NE(out.find("\"odd\": NaN"), std::string::npos) << out;
  EXPECT_NE(out.find("\"note\": \"Infinity and NaN in a string\""), std::string::npos) << out;
  EXPECT_NE(out.find(R"("quote": "a \"NaN\" quoted")"), std::string::npos) << out;
  EXPECT_EQ(out.find("@adjsh-json"), std::string::npos) << out;
  absl::StatusOr<MambaConfig> again = ParseConfigJson(out);  // and it reads back the same
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ConfigToJson(*again), out);
  // A Mamba-2 config is refused by its model_type, no longer as "not valid JSON".
  EXPECT_TRUE(IsInvalid(
      ParseConfigJson(R"({"model_type": "mamba2", "time_step_limit": [0.0, Infinity]})"),
      "\"model_type\"", "mamba2"));
  // Bad text is still bad, and a number field that is Infinity names its key.
  EXPECT_TRUE(IsInvalid(ParseConfigJson("{\"hidden_size\": Infinityx}"), "not valid JSON"));
  EXPECT_TRUE(IsInvalid(ParseConfigJson(R"({"hidden_size": 16, "num_hidden_layers": 2,
      "vocab_size": 7, "layer_norm_epsilon": Infinity})"), "layer_norm_epsilon"));
}

TEST(ConfigTest, ToJsonRoundTripsAndIsHfShaped) {
  MambaConfig c = *ParseConfigJson(kMamba130m);
  c.time_step_rank = 5;
  c.layer_norm_epsilon = 3e-6;
  const std::string text = ConfigToJson(c);
  Json j = Json::parse(text);
  EXPECT_EQ(j["model_type"], "mamba");
  EXPECT_EQ(j["architectures"], Json::array({"MambaForCausalLM"}));
  EXPECT_EQ(j["intermediate_size"], 1536);
  EXPECT_EQ(j["pad_token_id"], 0);
  absl::StatusOr<MambaConfig> back = ParseConfigJson(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->hidden_size, c.hidden_size);
  EXPECT_EQ(back->num_hidden_layers, c.num_hidden_layers);
  EXPECT_EQ(back->state_size, c.state_size);
  EXPECT_EQ(back->conv_kernel, c.conv_kernel);
  EXPECT_EQ(back->expand, c.expand);
  EXPECT_EQ(back->time_step_rank, 5);
  EXPECT_EQ(back->vocab_size, c.vocab_size);
  EXPECT_EQ(back->layer_norm_epsilon, 3e-6);  // exact: shortest round-trip formatting
}

TEST(ConfigTest, LoadFile) {
  const std::string dir = ScratchDir("config");
  EXPECT_TRUE(StatusIs(LoadConfigFile(dir + "/config.json"), absl::StatusCode::kNotFound,
                       "config.json"));
  {
    std::FILE* f = std::fopen((dir + "/config.json").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"hidden_size": 8, "num_hidden_layers": 1, "vocab_size": -1})", f);
    std::fclose(f);
  }
  EXPECT_TRUE(IsInvalid(LoadConfigFile(dir + "/config.json"), "config.json", "vocab_size"));
}

}  // namespace
}  // namespace adjsh
