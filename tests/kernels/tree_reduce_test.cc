// The worker tree's sums (engine/tree_reduce.h) against the coordinator's (FixedTreeSum,
// engine/span_ledger.h): for any owners, any order of leaves and of deliveries, and
// duplicates, every group's root is bitwise the one tree's, with leaves on the host or left on
// a device; only right children of nodes whose first span lives elsewhere cross between
// workers, and a device's nodes come to the host only when they leave it or meet a peer's.
#include "engine/tree_reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "engine/span_ledger.h"

namespace adjsh {
namespace {

constexpr int64_t kLayers = 1;  // groups 0 (a layer), 1, 2, 3: only their indices matter here

// Leaf values with large cancellations, so that another order of adds gives other bits.
GroupValue<float> Leaf(int64_t s, int32_t group, int64_t n) {
  static const float kBase[] = {1.0f, 1e8f, -1e8f, 0.5f, 3.25f, 1e-3f, -7.0f};
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i)
    v[i] = kBase[(s + i + group) % 7] * (1.0f + static_cast<float>(i) * 0.125f);
  return {v, std::vector<float>(2, static_cast<float>(s) + 0.25f)};
}

GroupValue<float> OneTree(int64_t S, int32_t group, int64_t n) {
  FixedTreeSum<GroupValue<float>> t(S, AddGroupValue<float>);
  for (int64_t s = 0; s < S; ++s) t.Add(s, Leaf(s, group, n));
  return t.TakeRoot();
}

bool Bitwise(const GroupValue<float>& a, const GroupValue<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t j = 0; j < a.size(); ++j) {
    if (a[j].size() != b[j].size() ||
        std::memcmp(a[j].data(), b[j].data(), a[j].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// A device's row space in host memory that counts what comes down and the waits (the tree's
// only use of a space: Add, Download, Finish).
class CountingSpace final : public RowSpace<float> {
 public:
  CountingSpace() : RowSpace<float>(0) {}
  bool host() const override { return false; }
  void Upload(float* d, const float* s, size_t n) override { std::memcpy(d, s, n * 4); }
  void Download(float* d, const float* s, size_t n) override {
    std::memcpy(d, s, n * 4);
    downloaded += static_cast<int64_t>(n);
  }
  void Copy(float* d, const float* s, size_t n) override { std::memcpy(d, s, n * 4); }
  void Add(float* d, const float* s, size_t n) override {
    for (size_t i = 0; i < n; ++i) d[i] += s[i];
    ++adds;
  }
  void Zero(float* d, size_t n) override { std::fill_n(d, n, 0.0f); }
  void MarkNonFinite(float*, const float*, size_t) override {}
  void WidenIds(float*, const float*, size_t) override {}
  void Finish() override { ++waits; }
  int64_t downloaded = 0, waits = 0, adds = 0;

 private:
  float* Allocate(size_t n) override { return new float[n]; }
  void Release(float* p, size_t) override { delete[] p; }
};

// A leaf's value flat on `space` (its tensors back to back), as a resident span leaves it.
RowBuffer<float> OnDevice(RowSpace<float>& space, const GroupValue<float>& v) {
  size_t n = 0;
  for (const auto& t : v) n += t.size();
  RowBuffer<float> b(space, n);
  float* p = b.data();
  for (const auto& t : v) p = std::copy(t.begin(), t.end(), p);
  return b;
}

struct Outcome {
  std::vector<GroupValue<float>> roots;  // per group
  int64_t transfers = 0;                 // node values sent from one worker to another
  int64_t roots_sent = 0;
  std::vector<int64_t> waits;            // per worker, with device leaves
};

// W workers owning spans by `owner`; leaves put in a random order (on each worker's device
// when `device`), messages delivered in a random order, each delivered twice with probability
// `dup`.
Outcome RunTree(int64_t S, const std::vector<int32_t>& owner, int W, uint32_t seed, double dup,
                bool device = false, bool tied = false) {
  const int32_t G = NumGroups(kLayers);
  std::vector<TreeReduce<float>> workers;
  std::deque<CountingSpace> spaces(W);
  for (int w = 0; w < W; ++w) {
    workers.emplace_back(S, owner, w, kLayers);
    if (device) workers.back().SetDevice(&spaces[w], std::vector<std::vector<size_t>>(G, {5, 2}));
    if (tied) workers.back().TieEmbedRoots();
  }
  std::mt19937 rng(seed);
  struct Leaf_ {
    int32_t group;
    int64_t s;
  };
  std::vector<Leaf_> leaves;
  for (int32_t g = 0; g < G; ++g)
    for (int64_t s = 0; s < S; ++s) leaves.push_back({g, s});
  std::shuffle(leaves.begin(), leaves.end(), rng);
  std::deque<TreeReduce<float>::Send> wire;
  Outcome out;
  out.roots.resize(G + 1);  // and TiedEmbedGroup's
  auto deliver_some = [&](bool all) {
    while (!wire.empty() && (all || rng() % 2 == 0)) {
      const size_t k = rng() % wire.size();
      TreeReduce<float>::Send m = wire[k];
      wire.erase(wire.begin() + static_cast<std::ptrdiff_t>(k));
      if (m.to == TreeReduce<float>::kCoordinator) {
        ++out.roots_sent;
        if (out.roots[m.group].empty()) out.roots[m.group] = m.value;
        ASSERT_TRUE(Bitwise(out.roots[m.group], m.value));
        continue;
      }
      ++out.transfers;
      std::vector<TreeReduce<float>::Send> sends;
      const int copies = std::uniform_real_distribution<double>(0, 1)(rng) < dup ? 2 : 1;
      for (int c = 0; c < copies; ++c) {
        bool fresh = false;
        ASSERT_TRUE(workers[m.to].Put(m.group, m.lo, m.hi, m.value, sends, &fresh).ok());
        EXPECT_EQ(fresh, c == 0);
      }
      for (auto& x : sends) wire.push_back(std::move(x));
    }
  };
  for (const Leaf_& l : leaves) {
    std::vector<TreeReduce<float>::Send> sends;
    const int32_t w = owner[l.s];
    const GroupValue<float> v = Leaf(l.s, l.group, 5);
    EXPECT_TRUE((device ? workers[w].PutLeaf(l.group, l.s, {}, OnDevice(spaces[w], v), sends)
                        : workers[w].PutLeaf(l.group, l.s, v, sends))
                    .ok());
    for (auto& x : sends) wire.push_back(std::move(x));
    deliver_some(false);
  }
  deliver_some(true);
  for (const TreeReduce<float>& w : workers) EXPECT_EQ(w.held(), 0);
  for (const CountingSpace& sp : spaces) out.waits.push_back(sp.waits);
  return out;
}

TEST(TreeReduceTest, AnyOwnersAndOrderGiveTheOneTreesBits) {
  for (int64_t S : {1, 2, 3, 7, 8, 13}) {
    for (int W : {1, 2, 3, 5}) {
      for (uint32_t seed = 0; seed < 6; ++seed) {
        std::mt19937 rng(seed * 31 + static_cast<uint32_t>(S * 7 + W));
        std::vector<int32_t> owner(S);
        for (int64_t s = 0; s < S; ++s)
          owner[s] = seed % 3 == 0   ? static_cast<int32_t>(s % W)       // round-robin
                     : seed % 3 == 1 ? static_cast<int32_t>(s * W / S)   // blocks
                                     : static_cast<int32_t>(rng() % W);  // any
        for (bool device : {false, true}) {
          const Outcome got = RunTree(S, owner, W, seed, 0.3, device);
          for (int32_t g = 0; g < NumGroups(kLayers); ++g) {
            ASSERT_FALSE(got.roots[g].empty()) << "S " << S << " W " << W << " group " << g;
            EXPECT_TRUE(Bitwise(got.roots[g], OneTree(S, g, 5)))
                << "S " << S << " W " << W << " seed " << seed << " group " << g
                << (device ? " device" : " host");
          }
        }
      }
    }
  }
}

// The tree really is used: summing the leaves in span order gives other bits.
TEST(TreeReduceTest, TheSumIsNotTheSequentialOne) {
  GroupValue<float> seq = Leaf(0, 0, 5);
  for (int64_t s = 1; s < 7; ++s) AddGroupValue(seq, Leaf(s, 0, 5));
  EXPECT_FALSE(Bitwise(seq, OneTree(7, 0, 5)));
}

// Where nodes cross: with blocks [0, 4) and [4, 8), only [4, 8) leaves worker 1, once per
// group; round-robin sends every odd leaf's value to its left neighbour's owner; one worker
// sends nothing but the roots.
TEST(TreeReduceTest, OnlyRightChildrenOfOtherWorkersNodesCross) {
  const int32_t G = NumGroups(kLayers);
  Outcome blocks = RunTree(8, {0, 0, 0, 0, 1, 1, 1, 1}, 2, 1, 0.0);
  EXPECT_EQ(blocks.transfers, G);
  EXPECT_EQ(blocks.roots_sent, G);
  Outcome rr = RunTree(8, {0, 1, 0, 1, 0, 1, 0, 1}, 2, 1, 0.0);
  EXPECT_EQ(rr.transfers, 4 * G);
  Outcome one = RunTree(8, std::vector<int32_t>(8, 0), 1, 1, 0.0);
  EXPECT_EQ(one.transfers, 0);
  EXPECT_EQ(one.roots_sent, G);
}

// With leaves on the device, a worker brings a group down once where it owns a block of spans:
// the one worker its roots, worker 1 of two its [4, 8), worker 0 its [0, 4) to add worker 1's
// to (on the host). Round-robin owners meet a peer's node at every level above the leaves.
TEST(TreeReduceTest, DeviceNodesComeDownOnlyToLeaveOrMeetAPeer) {
  const int32_t G = NumGroups(kLayers);
  EXPECT_EQ(RunTree(8, std::vector<int32_t>(8, 0), 1, 1, 0.0, true).waits,
            std::vector<int64_t>({G}));
  EXPECT_EQ(RunTree(8, {0, 0, 0, 0, 1, 1, 1, 1}, 2, 1, 0.0, true).waits,
            std::vector<int64_t>({G, G}));
  // Worker 0 sums [0, 2) from its leaf 0 and worker 1's leaf 1: its leaf 0 comes down, so do
  // 2 and 4 and 6; worker 1 sends its four leaves.
  EXPECT_EQ(RunTree(8, {0, 1, 0, 1, 0, 1, 0, 1}, 2, 1, 0.0, true).waits,
            std::vector<int64_t>({4 * G, 4 * G}));
}

// A tied model's head and lookups' roots reach the coordinator as one value, head + lookup
// as the ledger adds them, whoever owns what and wherever the leaves are; neither comes alone.
TEST(TreeReduceTest, TiedHeadAndLookupRootsLeaveAsTheirSum) {
  const int32_t head = HeadGroup(kLayers), lookup = LookupGroup(kLayers);
  for (int64_t S : {1, 5, 8}) {
    for (int W : {1, 2, 3}) {
      std::vector<int32_t> owner(S);
      for (int64_t s = 0; s < S; ++s) owner[s] = static_cast<int32_t>(s % W);
      GroupValue<float> want = OneTree(S, head, 5);
      AddGroupValue(want, OneTree(S, lookup, 5));
      for (bool device : {false, true}) {
        const Outcome got = RunTree(S, owner, W, 3, 0.2, device, /*tied=*/true);
        EXPECT_TRUE(got.roots[head].empty());
        EXPECT_TRUE(got.roots[lookup].empty());
        EXPECT_TRUE(Bitwise(got.roots[TiedEmbedGroup(kLayers)], want))
            << "S " << S << " W " << W << (device ? " device" : " host");
        EXPECT_EQ(got.roots_sent, NumGroups(kLayers) - 1);
      }
    }
  }
  // One worker with every leaf on its device: the tied pair comes down once.
  EXPECT_EQ(RunTree(8, std::vector<int32_t>(8, 0), 1, 1, 0.0, true, true).waits,
            std::vector<int64_t>({NumGroups(kLayers) - 1}));
}

TEST(TreeReduceTest, RefusesDeviceLeavesOfTheWrongSizeOrWithoutADevice) {
  CountingSpace space;
  std::vector<TreeReduce<float>::Send> out;
  TreeReduce<float> host_only(2, {0, 0}, 0, kLayers);
  EXPECT_FALSE(host_only.PutLeaf(0, 0, {}, OnDevice(space, Leaf(0, 0, 5)), out).ok());
  TreeReduce<float> r(2, {0, 0}, 0, kLayers);
  r.SetDevice(&space, std::vector<std::vector<size_t>>(NumGroups(kLayers), {5, 2}));
  EXPECT_FALSE(r.PutLeaf(0, 0, {}, OnDevice(space, Leaf(0, 0, 4)), out).ok());
  EXPECT_TRUE(r.PutLeaf(0, 0, {}, OnDevice(space, Leaf(0, 0, 5)), out).ok());
  EXPECT_TRUE(out.empty());
}

TEST(TreeReduceTest, RefusesNodesNotInTheTreeOrNotItsOwn) {
  TreeReduce<float> r(8, {0, 0, 0, 0, 1, 1, 1, 1}, 0, kLayers);
  std::vector<TreeReduce<float>::Send> out;
  EXPECT_FALSE(r.Put(0, 1, 3, Leaf(1, 0, 5), out).ok());  // [1, 3) is no node
  EXPECT_FALSE(r.Put(9, 0, 1, Leaf(0, 0, 5), out).ok());  // no group 9
  EXPECT_FALSE(r.Put(0, 5, 6, Leaf(5, 0, 5), out).ok());  // worker 1's leaf
  EXPECT_FALSE(r.PutLeaf(0, 5, Leaf(5, 0, 5), out).ok());  // not ours to compute either
  EXPECT_TRUE(r.Put(0, 4, 8, Leaf(4, 0, 5), out).ok());   // worker 1's right child: ours
  EXPECT_TRUE(out.empty());
}

// A peer cannot put a node this worker computes (its own leaves, and the sums of nodes whose
// first span it owns): accepted, it would make the worker's own value a duplicate, dropped
// unseen. The own leaf still goes in after such a refusal.
TEST(TreeReduceTest, PeersCannotPutNodesThisWorkerComputes) {
  TreeReduce<float> r(8, {0, 0, 0, 0, 1, 1, 1, 1}, 0, kLayers);
  std::vector<TreeReduce<float>::Send> out;
  EXPECT_FALSE(r.Put(0, 0, 1, Leaf(0, 0, 5), out).ok());
  EXPECT_FALSE(r.Put(0, 1, 2, Leaf(1, 0, 5), out).ok());
  EXPECT_FALSE(r.Put(0, 0, 2, Leaf(0, 0, 5), out).ok());  // the sum of its leaves 0 and 1
  bool fresh = false;
  EXPECT_TRUE(r.PutLeaf(0, 0, Leaf(0, 0, 5), out, &fresh).ok());
  EXPECT_TRUE(fresh);
}

}  // namespace
}  // namespace adjsh
