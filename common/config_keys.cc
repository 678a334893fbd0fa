#include "common/config_keys.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/python_json.h"

namespace adjsh::config_keys {
namespace {

std::string TypeOf(const Json& j) { return j.is_number_float() ? "a float" : j.type_name(); }

// What a key holds, for a message: its type and value ("string \"8\"", "a float 8.5"), or null.
std::string Got(const Json& j) { return j.is_null() ? "null" : TypeOf(j) + " " + j.dump(); }

}  // namespace

absl::Status BadKey(absl::string_view key, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat("config key \"", key, "\": ", detail));
}

absl::Status ReadInt(const Json& j, const char* key, bool required, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end()) return required ? BadKey(key, "missing (required)") : absl::OkStatus();
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return BadKey(key, absl::StrCat("value ", it->dump(), " is out of range"));
    }
    *out = static_cast<int64_t>(it->get<uint64_t>());
    return absl::OkStatus();
  }
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
    return absl::OkStatus();
  }
  return BadKey(key, absl::StrCat("must be an integer, got ", Got(*it)));
}

absl::Status ReadDouble(const Json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end()) return absl::OkStatus();
  if (!it->is_number()) {
    return BadKey(key, absl::StrCat("must be a number, got ", Got(*it)));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return BadKey(key, absl::StrCat("must be true or false, got ", Got(*it)));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status CheckRange(const char* key, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return BadKey(key, absl::StrCat("value ", value, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> ParseConfigObject(std::string_view python_json_text, std::string* strict) {
  *strict = PythonJsonToStrict(python_json_text);
  Json j = Json::parse(strict->begin(), strict->end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("config.json is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("config.json is not a JSON object");
  return j;
}

absl::Status CheckHiddenAct(const Json& j) {
  if (auto act = j.find("hidden_act"); act != j.end() && *act != "silu") {
    return BadKey("hidden_act", absl::StrCat(act->dump(), " is not supported (silu only)"));
  }
  return absl::OkStatus();
}

std::string ExtraKeys(const std::string& strict, KeyFilter is_read) {
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  const nlohmann::ordered_json ordered =
      nlohmann::ordered_json::parse(strict.begin(), strict.end(), nullptr, false);
  for (const auto& [key, value] : ordered.items())
    if (!is_read(key)) extra[key] = value;
  return extra.empty() ? "" : extra.dump();
}

std::string WriteWithExtra(nlohmann::ordered_json j, const std::string& extra, KeyFilter is_read) {
  if (!extra.empty()) {
    const nlohmann::ordered_json e = nlohmann::ordered_json::parse(extra, nullptr, false);
    if (e.is_object())
      for (const auto& [key, value] : e.items())
        if (!is_read(key)) j[key] = value;
  }
  return StrictJsonToPython(j.dump(2)) + "\n";  // Infinity and NaN as Python wrote them
}

}  // namespace adjsh::config_keys
