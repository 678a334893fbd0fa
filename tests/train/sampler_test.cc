// SequenceSampler (train/sampler.h): sequential is the corpus in order, wrapping round; a
// shuffled epoch visits every window exactly once, epochs differ, and the order is a pure
// function of (seed, epoch, index).
#include "train/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace adjsh::train {
namespace {

TEST(SamplerTest, SequentialIsTheCorpusInOrderWrappingRound) {
  const SequenceSampler s(1000, 300, DataOrder::kSequential, 7);  // 3 windows, 100 left over
  EXPECT_EQ(s.windows(), 3);
  const std::vector<int64_t> want = {0, 300, 600, 0, 300, 600, 0};
  for (int64_t q = 0; q < 7; ++q) EXPECT_EQ(s.Start(q), want[q]) << q;
}

TEST(SamplerTest, ShuffledEpochsArePermutationsKeyedBySeedAndEpoch) {
  for (int64_t W : {1, 2, 3, 5, 16, 17, 1000, 4097}) {
    const SequenceSampler s(W * 10, 10, DataOrder::kShuffled, 42);
    ASSERT_EQ(s.windows(), W);
    std::vector<int64_t> e0, e1;
    for (int64_t i = 0; i < W; ++i) e0.push_back(s.Window(0, i)), e1.push_back(s.Window(1, i));
    std::vector<int64_t> sorted = e0;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < W; ++i) ASSERT_EQ(sorted[i], i) << "W=" << W << ": not a permutation";
    std::sort(e1.begin(), e1.end());
    for (int64_t i = 0; i < W; ++i) ASSERT_EQ(e1[i], i) << "W=" << W;
    if (W >= 16) {
      std::vector<int64_t> again;
      for (int64_t i = 0; i < W; ++i) again.push_back(s.Window(1, i));
      EXPECT_NE(e0, again) << "W=" << W << ": epochs 0 and 1 in the same order";
      int64_t fixed = 0;  // a shuffle moves most windows
      for (int64_t i = 0; i < W; ++i) fixed += e0[i] == i;
      EXPECT_LT(fixed, W / 4) << "W=" << W;
      const SequenceSampler other(W * 10, 10, DataOrder::kShuffled, 43);
      std::vector<int64_t> o;
      for (int64_t i = 0; i < W; ++i) o.push_back(other.Window(0, i));
      EXPECT_NE(e0, o) << "W=" << W << ": seeds 42 and 43 in the same order";
    }
  }
  // A pure function: another sampler with the same key gives the same starts (a resumed run).
  const SequenceSampler a(5000, 50, DataOrder::kShuffled, 9), b(5000, 50, DataOrder::kShuffled, 9);
  for (int64_t q = 0; q < 350; ++q) EXPECT_EQ(a.Start(q), b.Start(q));
  EXPECT_EQ(a.Start(123) % 50, 0);
}

TEST(SamplerTest, NamesRoundTrip) {
  EXPECT_EQ(*DataOrderFromName("sequential"), DataOrder::kSequential);
  EXPECT_EQ(*DataOrderFromName("shuffled"), DataOrder::kShuffled);
  EXPECT_FALSE(DataOrderFromName("random").ok());
  EXPECT_EQ(DataOrderName(DataOrder::kShuffled), "shuffled");
}

}  // namespace
}  // namespace adjsh::train
