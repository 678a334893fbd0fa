// Debian's Abseil (20220623) is built with its own absl::string_view, not std::string_view, so
// StrCat and Status messages do not take std::string_view directly; these bridge the two.
#ifndef ADJSH_COMMON_STRINGS_H_
#define ADJSH_COMMON_STRINGS_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace adjsh {

inline absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view ToStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace adjsh

#endif  // ADJSH_COMMON_STRINGS_H_
