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

// The directory under which this test process keeps its files, removed with everything in it
// when the process exits normally (a crashed test's files stay behind for a look).
inline const std::filesystem::path& ScratchRoot() {
  struct Root {
    std::filesystem::path path;
    ~Root() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Root root{std::filesystem::path(::testing::TempDir()) /
                         ("adjsh_test_" + std::to_string(::getpid()))};
  return root.path;
}

// A path under ScratchRoot for one test's files, not yet created (removed first if a previous
// use left it).
inline std::string ScratchPath(std::string_view name) {
  const std::filesystem::path dir = ScratchRoot() / std::string(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(ScratchRoot());
  return dir.string();
}

// A fresh, empty directory for one test, under ScratchRoot.
inline std::string ScratchDir(std::string_view name) {
  static std::atomic<int> counter{0};
  const std::string dir = ScratchPath(std::to_string(counter++) + "_" + std::string(name));
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace adjsh::testing

#endif  // ADJSH_TESTS_COMMON_TEST_UTIL_H_
