// Reading config.json keys with errors that name them: shared by the Mamba-1 config
// (common/config.h) and the Mamba-2 one (common/mamba2_config.h).
#ifndef ADJSH_COMMON_CONFIG_KEYS_H_
#define ADJSH_COMMON_CONFIG_KEYS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace adjsh::config_keys {

using Json = nlohmann::json;

// INVALID_ARGUMENT "config key \"key\": detail".
absl::Status BadKey(absl::string_view key, absl::string_view detail);

// Each reads key into *out; an absent key keeps *out (ReadInt: unless required) and a value of
// another type is refused naming the key.
absl::Status ReadInt(const Json& j, const char* key, bool required, int64_t* out);
absl::Status ReadDouble(const Json& j, const char* key, double* out);
absl::Status ReadBool(const Json& j, const char* key, bool* out);

// The sizes both model types' configs have, read in this order: hidden_size, num_hidden_layers
// and vocab_size (required), state_size, conv_kernel and expand. C: MambaConfig, Mamba2Config.
template <typename C>
absl::Status ReadSharedSizes(const Json& j, C& c) {
  const struct {
    const char* key;
    bool required;
    int64_t* out;
  } sizes[] = {{"hidden_size", true, &c.hidden_size},
               {"num_hidden_layers", true, &c.num_hidden_layers},
               {"vocab_size", true, &c.vocab_size},
               {"state_size", false, &c.state_size},
               {"conv_kernel", false, &c.conv_kernel},
               {"expand", false, &c.expand}};
  for (const auto& s : sizes)
    if (absl::Status st = ReadInt(j, s.key, s.required, s.out); !st.ok()) return st;
  return absl::OkStatus();
}

// The keys config.json starts with for either model type, in transformers' order: its
// architecture and model_type, then the sizes both have (ReadSharedSizes') but vocab_size.
template <typename C>
void WriteSharedKeys(const char* architecture, const char* model_type, const C& c,
                     nlohmann::ordered_json& j) {
  j["architectures"] = {architecture};
  j["model_type"] = model_type;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["state_size"] = c.state_size;
  j["conv_kernel"] = c.conv_kernel;
  j["expand"] = c.expand;
}

// value in [lo, hi], else BadKey.
absl::Status CheckRange(const char* key, int64_t value, int64_t lo, int64_t hi);

// config.json text as transformers writes it (common/python_json.h) into *strict and its JSON
// object; INVALID_ARGUMENT when it is not valid JSON or not an object.
absl::StatusOr<Json> ParseConfigObject(std::string_view python_json_text, std::string* strict);

// hidden_act absent or "silu", else BadKey.
absl::Status CheckHiddenAct(const Json& j);

// The keys of the strict text's object that is_read does not claim, as a JSON object in file
// order ("" when none): a config's `extra`.
using KeyFilter = bool (*)(const std::string& key);
std::string ExtraKeys(const std::string& strict, KeyFilter is_read);

// j then extra's keys that is_read does not claim, as Python's json writes them back.
std::string WriteWithExtra(nlohmann::ordered_json j, const std::string& extra, KeyFilter is_read);

}  // namespace adjsh::config_keys

#endif  // ADJSH_COMMON_CONFIG_KEYS_H_
