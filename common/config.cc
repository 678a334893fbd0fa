// config.json <-> MambaConfig, in the Hugging Face MambaConfig spelling.
#include "common/config.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/config_keys.h"
#include "common/file_io.h"

namespace adjsh {
namespace {

using config_keys::BadKey;
using config_keys::CheckRange;
using config_keys::Json;
using config_keys::ReadBool;
using config_keys::ReadDouble;
using config_keys::ReadInt;

// The keys adjsh reads into MambaConfig (and model_type, which it checks and writes).
bool IsShapeKey(const std::string& key) {
  static const char* const kKeys[] = {
      "model_type", "hidden_size", "num_hidden_layers", "state_size", "conv_kernel", "expand",
      "intermediate_size", "time_step_rank", "vocab_size", "layer_norm_epsilon", "use_bias",
      "use_conv_bias", "tie_word_embeddings"};
  for (const char* k : kKeys)
    if (key == k) return true;
  return false;
}

}  // namespace

absl::Status ValidateConfig(const MambaConfig& c) {
  // Upper bounds are far above any published Mamba (2.8B: D 2560, K 64) and keep every size
  // product (V*D, Di*N, ...) well inside int64.
  struct Bound {
    const char* key;
    int64_t value, hi;
  };
  const Bound bounds[] = {
      {"hidden_size", c.hidden_size, 65536},
      {"num_hidden_layers", c.num_hidden_layers, 1024},
      {"state_size", c.state_size, 1024},
      {"conv_kernel", c.conv_kernel, 64},
      {"expand", c.expand, 16},
      {"time_step_rank", c.time_step_rank, 65536},
      {"vocab_size", c.vocab_size, std::numeric_limits<int32_t>::max()},
  };
  for (const Bound& b : bounds) {
    if (absl::Status s = CheckRange(b.key, b.value, 1, b.hi); !s.ok()) return s;
  }
  if (!std::isfinite(c.layer_norm_epsilon) || !(c.layer_norm_epsilon > 0)) {
    return BadKey("layer_norm_epsilon",
                  absl::StrCat("must be positive and finite, got ", c.layer_norm_epsilon));
  }
  if (c.use_bias) return BadKey("use_bias", "adjsh supports use_bias = false only");
  if (!c.use_conv_bias) return BadKey("use_conv_bias", "adjsh supports use_conv_bias = true only");
  return absl::OkStatus();
}

absl::StatusOr<MambaConfig> ParseConfigJson(std::string_view python_json_text) {
  // As transformers writes it: Infinity and NaN may appear (common/python_json.h).
  std::string json_text;
  absl::StatusOr<Json> parsed = config_keys::ParseConfigObject(python_json_text, &json_text);
  if (!parsed.ok()) return parsed.status();
  const Json& j = *parsed;

  if (auto type = j.find("model_type"); type != j.end() && *type != "mamba") {
    return BadKey("model_type",
                  absl::StrCat(type->dump(), " is not supported: adjsh implements \"mamba\" "
                               "(MambaForCausalLM), and \"mamba2\" (Mamba2ForCausalLM) for "
                               "adjsh grad, eval and generate"));
  }
  if (absl::Status s = config_keys::CheckHiddenAct(j); !s.ok()) return s;
  MambaConfig c;
  absl::Status s;
  if (s = config_keys::ReadSharedSizes(j, c); !s.ok()) return s;
  if (s = ReadDouble(j, "layer_norm_epsilon", &c.layer_norm_epsilon); !s.ok()) return s;
  if (s = ReadBool(j, "use_bias", &c.use_bias); !s.ok()) return s;
  if (s = ReadBool(j, "use_conv_bias", &c.use_conv_bias); !s.ok()) return s;
  if (s = ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings); !s.ok()) return s;

  // time_step_rank: an integer, or "auto" (HF's default) = ceil(D / 16).
  auto rank = j.find("time_step_rank");
  if (rank == j.end() || (rank->is_string() && rank->get<std::string>() == "auto")) {
    c.time_step_rank = c.hidden_size / 16 + (c.hidden_size % 16 != 0);  // no overflow near max
  } else if (s = ReadInt(j, "time_step_rank", false, &c.time_step_rank); !s.ok()) {
    return BadKey("time_step_rank",
                  absl::StrCat("must be an integer or \"auto\", got ", rank->dump()));
  }
  if (s = ValidateConfig(c); !s.ok()) return s;

  // HF builds the layers from intermediate_size when present; it must agree with expand * D.
  int64_t intermediate = c.inner();
  if (s = ReadInt(j, "intermediate_size", false, &intermediate); !s.ok()) return s;
  if (intermediate != c.inner()) {
    return BadKey("intermediate_size",
                  absl::StrCat("value ", intermediate, " differs from expand * hidden_size = ",
                               c.inner(), "; adjsh supports intermediate_size = expand * "
                               "hidden_size only"));
  }
  c.extra = config_keys::ExtraKeys(json_text, IsShapeKey);
  return c;
}

absl::StatusOr<MambaConfig> LoadConfigFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<MambaConfig> c = ParseConfigJson(*text);
  if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  return c;
}

std::string ShapeJson(const MambaConfig& c) {
  MambaConfig shape = c;
  shape.extra.clear();
  return ConfigToJson(shape);
}

std::string ConfigToJson(const MambaConfig& c) {
  // Keys and values as transformers' MambaConfig writes them, so the directory loads there.
  nlohmann::ordered_json j;
  config_keys::WriteSharedKeys("MambaForCausalLM", "mamba", c, j);
  j["intermediate_size"] = c.inner();
  j["time_step_rank"] = c.time_step_rank;
  j["vocab_size"] = c.vocab_size;
  j["layer_norm_epsilon"] = c.layer_norm_epsilon;
  j["use_bias"] = c.use_bias;
  j["use_conv_bias"] = c.use_conv_bias;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["residual_in_fp32"] = true;
  j["pad_token_id"] = 0;
  j["bos_token_id"] = 0;
  j["eos_token_id"] = 0;
  return config_keys::WriteWithExtra(std::move(j), c.extra, IsShapeKey);
}

}  // namespace adjsh
