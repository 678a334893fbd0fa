// Debian's Abseil (20220623) is built with its own absl::string_view, not std::string_view, so
// StrCat and Status messages do not take std::string_view directly; these bridge the two.
#ifndef ADJSH_COMMON_STRINGS_H_
#define ADJSH_COMMON_STRINGS_H_

#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace adjsh {

inline absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view ToStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

// A caller's string as an error message may echo it: at most `max` bytes, then "...(N bytes)".
// Messages travel in gRPC metadata, which a long echo would push over its limit.
inline std::string Echo(std::string_view s, size_t max = 128) {
  if (s.size() <= max) return std::string(s);
  return std::string(s.substr(0, max)) + "...(" + std::to_string(s.size()) + " bytes)";
}

}  // namespace adjsh

#endif  // ADJSH_COMMON_STRINGS_H_
