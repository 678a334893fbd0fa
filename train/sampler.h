// Which tokens each training sequence takes. The corpus (documents packed end to end, as
// adjsh_data.py prepare writes them) is cut into W = floor(n / T) windows of T tokens; sequence
// number q (counted from the run's start, across steps and epochs) is window
// order_e(q mod W) of epoch e = q div W. In order kSequential order_e is the identity (the
// corpus from its start, wrapping round); in kShuffled it is a pseudo-random permutation of
// [0, W) keyed by (seed, e): a 4-round Feistel network on the smallest power of 4 >= W, walked
// until it lands below W. It needs no table (O(1) memory for any W), is a bijection (every
// window once per epoch), and is a pure function of (seed, e, index), so a run resumed from the
// sequence count in its checkpoint takes the same windows as one never stopped.
#ifndef ADJSH_TRAIN_SAMPLER_H_
#define ADJSH_TRAIN_SAMPLER_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace adjsh::train {

enum class DataOrder { kSequential, kShuffled };
absl::StatusOr<DataOrder> DataOrderFromName(std::string_view name);  // sequential | shuffled
std::string_view DataOrderName(DataOrder order);

class SequenceSampler {
 public:
  // n tokens, windows of T (1 <= T <= n).
  SequenceSampler(int64_t n, int64_t T, DataOrder order, uint64_t seed);
  int64_t windows() const { return W_; }
  // The first token of sequence q (q >= 0).
  int64_t Start(int64_t q) const;
  // The window at position index (0 <= index < W) of epoch e.
  int64_t Window(int64_t epoch, int64_t index) const;

 private:
  int64_t T_, W_;
  DataOrder order_;
  uint64_t seed_;
  int half_bits_ = 0;  // the Feistel halves: 2 * half_bits_ bits cover [0, W)
};

}  // namespace adjsh::train

#endif  // ADJSH_TRAIN_SAMPLER_H_
