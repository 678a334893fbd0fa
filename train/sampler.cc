#include "train/sampler.h"

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/hash.h"

namespace adjsh::train {
absl::StatusOr<DataOrder> DataOrderFromName(std::string_view name) {
  if (name == "sequential") return DataOrder::kSequential;
  if (name == "shuffled") return DataOrder::kShuffled;
  return absl::InvalidArgumentError(
      absl::StrCat("data order must be sequential or shuffled, got '", std::string(name), "'"));
}

std::string_view DataOrderName(DataOrder order) {
  return order == DataOrder::kShuffled ? "shuffled" : "sequential";
}

SequenceSampler::SequenceSampler(int64_t n, int64_t T, DataOrder order, uint64_t seed)
    : T_(T), W_(T >= 1 ? n / T : 0), order_(order), seed_(seed) {
  ADJSH_CHECK(T >= 1 && W_ >= 1, "the sampler needs 1 <= T <= n");
  while ((uint64_t{1} << (2 * half_bits_)) < static_cast<uint64_t>(W_)) ++half_bits_;
}

int64_t SequenceSampler::Window(int64_t epoch, int64_t index) const {
  if (order_ == DataOrder::kSequential || W_ == 1) return index;
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  const uint64_t key = SplitMix64(seed_ ^ SplitMix64(static_cast<uint64_t>(epoch)));
  uint64_t x = static_cast<uint64_t>(index);
  do {  // cycle-walking: a bijection on [0, 4^h) restricted to [0, W) stays one
    uint64_t left = x >> half_bits_, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = SplitMix64(key + round * 0x632be59bd9b4e019ull + right) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= static_cast<uint64_t>(W_));
  return static_cast<int64_t>(x);
}

int64_t SequenceSampler::Start(int64_t q) const {
  return Window(q / W_, q % W_) * T_;
}

}  // namespace adjsh::train
