#include "common/proc_stats.h"

#include <fstream>
#include <string>

namespace adjsh {
namespace {
int64_t StatusField(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;  // "... kB"
  }
  return -1;
}
}  // namespace

int64_t ResidentBytes() { return StatusField("VmRSS:"); }
int64_t PeakResidentBytes() { return StatusField("VmHWM:"); }

}  // namespace adjsh
