// ADJSH_CHECK: for broken preconditions that are programming errors (a caller passing values of
// the wrong size), not for bad input, which gets an absl::Status. Prints where and why, then
// aborts, in every build type (a silently wrong gradient is worse than a crash).
#ifndef ADJSH_COMMON_CHECK_H_
#define ADJSH_COMMON_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define ADJSH_CHECK(cond, msg)                                                      \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__,     \
                   #cond, (msg));                                                   \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#endif  // ADJSH_COMMON_CHECK_H_
