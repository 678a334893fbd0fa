// Unsigned arithmetic that saturates at UINT64_MAX instead of wrapping: byte counts of what a
// request or a config asks for, compared against limits, whatever the sizes given.
#ifndef ADJSH_COMMON_SATURATING_H_
#define ADJSH_COMMON_SATURATING_H_

#include <cstdint>

namespace adjsh {

inline uint64_t SatMul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? ~uint64_t{0} : r;
}

inline uint64_t SatAdd(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? ~uint64_t{0} : r;
}

}  // namespace adjsh

#endif  // ADJSH_COMMON_SATURATING_H_
