// FUZZ_CHECK: a property every input must satisfy (a parser that accepted bytes must give
// something valid that survives a round trip). A failure prints the property and aborts, which
// libFuzzer and the replay tests both report as a crash.
#ifndef ADJSH_FUZZ_FUZZ_CHECK_H_
#define ADJSH_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                        \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

#endif  // ADJSH_FUZZ_FUZZ_CHECK_H_
