// Process memory figures from /proc/self/status (Linux): resident and peak resident bytes.
#ifndef ADJSH_COMMON_PROC_STATS_H_
#define ADJSH_COMMON_PROC_STATS_H_

#include <cstdint>

namespace adjsh {

int64_t ResidentBytes();      // VmRSS; -1 if unavailable
int64_t PeakResidentBytes();  // VmHWM; -1 if unavailable

}  // namespace adjsh

#endif  // ADJSH_COMMON_PROC_STATS_H_
