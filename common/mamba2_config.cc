// config.json <-> Mamba2Config, in the Hugging Face Mamba2Config spelling.
#include "common/mamba2_config.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/config_keys.h"
#include "common/file_io.h"
#include "common/python_json.h"

namespace adjsh {
namespace {

using config_keys::BadKey;
using config_keys::CheckRange;
using config_keys::Json;
using config_keys::ReadBool;
using config_keys::ReadDouble;
using config_keys::ReadInt;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr char kInfinityMarker[] = "@adjsh-json:Infinity@";  // common/python_json.h

// The keys adjsh reads into Mamba2Config (and model_type and architectures, which it writes).
bool IsShapeKey(const std::string& key) {
  static const char* const kKeys[] = {
      "model_type", "architectures", "hidden_size", "num_hidden_layers", "state_size",
      "conv_kernel", "expand", "head_dim", "num_heads", "n_groups", "vocab_size", "chunk_size",
      "layer_norm_epsilon", "time_step_limit", "use_bias", "use_conv_bias", "rms_norm",
      "tie_word_embeddings"};
  for (const char* k : kKeys)
    if (key == k) return true;
  return false;
}

// A limit of time_step_limit: a number or Infinity (the marker PythonJsonToStrict made of it).
bool ReadLimit(const Json& v, double* out) {
  if (v.is_number()) {
    *out = v.get<double>();
    return true;
  }
  if (v.is_string() && v.get<std::string>() == kInfinityMarker) {
    *out = kInf;
    return true;
  }
  return false;
}

}  // namespace

std::string ModelTypeOfDir(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFileToString(dir + "/config.json");
  if (!text.ok()) return "";
  absl::StatusOr<std::string> type = ModelTypeOf(*text);
  return type.ok() ? *type : "";
}

absl::StatusOr<std::string> ModelTypeOf(std::string_view python_json_text) {
  std::string text;
  absl::StatusOr<Json> parsed = config_keys::ParseConfigObject(python_json_text, &text);
  if (!parsed.ok()) return parsed.status();
  const Json& j = *parsed;
  auto type = j.find("model_type");
  if (type == j.end()) return std::string();
  if (!type->is_string()) return BadKey("model_type", "must be a string");
  return type->get<std::string>();
}

absl::Status ValidateMamba2Config(const Mamba2Config& c) {
  struct Bound {
    const char* key;
    int64_t value, hi;
  };
  // Far above any published Mamba-2 (Codestral 7B: D 4096, K 64, H 128, N 128) and keeping
  // every size product inside int64.
  const Bound bounds[] = {
      {"hidden_size", c.hidden_size, 65536},   {"num_hidden_layers", c.num_hidden_layers, 1024},
      {"state_size", c.state_size, 1024},      {"conv_kernel", c.conv_kernel, 64},
      {"expand", c.expand, 16},                {"head_dim", c.head_dim, 65536},
      {"num_heads", c.num_heads, 65536},       {"n_groups", c.n_groups, 65536},
      {"chunk_size", c.chunk_size, 1 << 20},
      {"vocab_size", c.vocab_size, std::numeric_limits<int32_t>::max()},
  };
  for (const Bound& b : bounds) {
    if (absl::Status s = CheckRange(b.key, b.value, 1, b.hi); !s.ok()) return s;
  }
  if (c.num_heads * c.head_dim != c.inner()) {
    return BadKey("num_heads", absl::StrCat("num_heads x head_dim = ", c.num_heads, " x ",
                                            c.head_dim, " = ", c.num_heads * c.head_dim,
                                            " differs from expand x hidden_size = ", c.inner()));
  }
  if (c.num_heads % c.n_groups != 0) {
    return BadKey("n_groups", absl::StrCat("n_groups ", c.n_groups, " does not divide num_heads ",
                                           c.num_heads));
  }
  if (!std::isfinite(c.layer_norm_epsilon) || !(c.layer_norm_epsilon > 0)) {
    return BadKey("layer_norm_epsilon",
                  absl::StrCat("must be positive and finite, got ", c.layer_norm_epsilon));
  }
  if (!(c.time_step_min_limit >= 0) || !(c.time_step_max_limit > c.time_step_min_limit) ||
      std::isnan(c.time_step_max_limit)) {
    return BadKey("time_step_limit",
                  absl::StrCat("must be [min, max] with 0 <= min < max, got [",
                               c.time_step_min_limit, ", ", c.time_step_max_limit, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Mamba2Config> ParseMamba2ConfigJson(std::string_view python_json_text) {
  std::string json_text;
  absl::StatusOr<Json> parsed = config_keys::ParseConfigObject(python_json_text, &json_text);
  if (!parsed.ok()) return parsed.status();
  const Json& j = *parsed;
  if (auto type = j.find("model_type"); type == j.end() || *type != "mamba2") {
    return BadKey("model_type", absl::StrCat(type == j.end() ? "missing" : type->dump(),
                                             ": a Mamba-2 model is \"mamba2\""));
  }
  if (absl::Status s = config_keys::CheckHiddenAct(j); !s.ok()) return s;
  Mamba2Config c;
  absl::Status s;
  if (s = config_keys::ReadSharedSizes(j, c); !s.ok()) return s;
  if (s = ReadInt(j, "head_dim", false, &c.head_dim); !s.ok()) return s;
  if (s = ReadInt(j, "num_heads", false, &c.num_heads); !s.ok()) return s;
  if (s = ReadInt(j, "n_groups", false, &c.n_groups); !s.ok()) return s;
  if (s = ReadInt(j, "chunk_size", false, &c.chunk_size); !s.ok()) return s;
  if (s = ReadDouble(j, "layer_norm_epsilon", &c.layer_norm_epsilon); !s.ok()) return s;
  if (s = ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings); !s.ok()) return s;
  bool use_bias = false, use_conv_bias = true, rms_norm = true;
  if (s = ReadBool(j, "use_bias", &use_bias); !s.ok()) return s;
  if (s = ReadBool(j, "use_conv_bias", &use_conv_bias); !s.ok()) return s;
  if (s = ReadBool(j, "rms_norm", &rms_norm); !s.ok()) return s;
  if (use_bias) return BadKey("use_bias", "adjsh supports use_bias = false only");
  if (!use_conv_bias) return BadKey("use_conv_bias", "adjsh supports use_conv_bias = true only");
  if (!rms_norm) return BadKey("rms_norm", "adjsh supports rms_norm = true only (the gated norm)");
  if (auto lim = j.find("time_step_limit"); lim != j.end()) {
    if (!lim->is_array() || lim->size() != 2 || !ReadLimit((*lim)[0], &c.time_step_min_limit) ||
        !ReadLimit((*lim)[1], &c.time_step_max_limit)) {
      return BadKey("time_step_limit",
                    absl::StrCat("must be [min, max] of numbers, got ",
                                 StrictJsonToPython(lim->dump())));
    }
  }
  if (s = ValidateMamba2Config(c); !s.ok()) return s;
  c.extra = config_keys::ExtraKeys(json_text, IsShapeKey);
  return c;
}

std::string Mamba2ConfigToJson(const Mamba2Config& c) {
  nlohmann::ordered_json j;
  config_keys::WriteSharedKeys("Mamba2ForCausalLM", "mamba2", c, j);
  j["head_dim"] = c.head_dim;
  j["num_heads"] = c.num_heads;
  j["n_groups"] = c.n_groups;
  j["vocab_size"] = c.vocab_size;
  j["chunk_size"] = c.chunk_size;
  j["layer_norm_epsilon"] = c.layer_norm_epsilon;
  auto limit = [](double v) -> nlohmann::ordered_json {
    if (v == kInf) return kInfinityMarker;
    return v;
  };
  j["time_step_limit"] = {limit(c.time_step_min_limit), limit(c.time_step_max_limit)};
  j["use_bias"] = false;
  j["use_conv_bias"] = true;
  j["rms_norm"] = true;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  return config_keys::WriteWithExtra(std::move(j), c.extra, IsShapeKey);
}

}  // namespace adjsh
