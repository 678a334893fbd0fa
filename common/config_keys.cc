#include "common/config_keys.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace adjsh::config_keys {
namespace {

std::string TypeOf(const Json& j) { return j.is_number_float() ? "a float" : j.type_name(); }

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
  return BadKey(key, absl::StrCat("must be an integer, got ", TypeOf(*it), " ", it->dump()));
}

absl::Status ReadDouble(const Json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end()) return absl::OkStatus();
  if (!it->is_number()) {
    return BadKey(key, absl::StrCat("must be a number, got ", TypeOf(*it), " ", it->dump()));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return BadKey(key, absl::StrCat("must be true or false, got ", TypeOf(*it), " ", it->dump()));
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

}  // namespace adjsh::config_keys
