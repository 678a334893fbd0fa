// Helpers for the common/ tests: status checks that name the expected code and message text,
// and scratch paths under the test's temporary directory.
#ifndef ADJSH_TESTS_COMMON_TEST_UTIL_H_
#define ADJSH_TESTS_COMMON_TEST_UTIL_H_

#include <atomic>
#include <filesystem>
#include <string>
#include <string_view>

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace adjsh::testing {

// Succeeds when `status` has `code` and its message contains every one of `parts`.
template <typename... Parts>
::testing::AssertionResult StatusIs(const absl::Status& status, absl::StatusCode code,
                                    const Parts&... parts) {
  if (status.code() != code) {
    return ::testing::AssertionFailure()
           << "expected " << absl::StatusCodeToString(code) << ", got " << status;
  }
  const std::string message(status.message());
  for (std::string_view part : {std::string_view(parts)...}) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message \"" << message << "\" does not contain \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T, typename... Parts>
::testing::AssertionResult StatusIs(const absl::StatusOr<T>& s, absl::StatusCode code,
                                    const Parts&... parts) {
  return StatusIs(s.status(), code, parts...);
}

template <typename... Parts>
::testing::AssertionResult IsInvalid(const auto& s, const Parts&... parts) {
  return StatusIs(s, absl::StatusCode::kInvalidArgument, parts...);
}

// A fresh, empty directory for one test (removed first if a previous run left it).
inline std::string ScratchDir(std::string_view name) {
  static std::atomic<int> counter{0};
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                              ("adjsh_common_" + std::to_string(::getpid()) + "_" +
                               std::to_string(counter++) + "_" + std::string(name));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace adjsh::testing

#endif  // ADJSH_TESTS_COMMON_TEST_UTIL_H_
