// The reduction tree over span indices (docs/ARCHITECTURE.md "A step"): node [lo, hi) has
// children [lo, mid) and [mid, hi), mid = lo + (hi - lo) / 2, down to single spans. Its shape
// depends on the span count S alone, so a sum taken in it (left + right at every node) has the
// same bits wherever each node is computed: in the coordinator's ledger (engine/span_ledger.h)
// or among the workers (engine/tree_reduce.h).
#ifndef ADJSH_ENGINE_SPAN_TREE_H_
#define ADJSH_ENGINE_SPAN_TREE_H_

#include <cstdint>
#include <vector>

#include "common/check.h"

namespace adjsh {

class SpanTree {
 public:
  struct Node {
    int64_t lo, hi;
    int64_t parent;       // -1 at the root
    int64_t left, right;  // -1 at a leaf
  };

  explicit SpanTree(int64_t n) : leaf_(n, -1) {
    ADJSH_CHECK(n >= 1, "a span tree needs a leaf");
    Build(0, n, -1);
  }

  int64_t size() const { return static_cast<int64_t>(nodes_.size()); }
  int64_t leaves() const { return static_cast<int64_t>(leaf_.size()); }
  const Node& node(int64_t id) const { return nodes_[id]; }
  static constexpr int64_t kRoot = 0;
  int64_t leaf(int64_t s) const { return leaf_[s]; }
  // The node spanning exactly [lo, hi), or -1 when the tree has none.
  int64_t Find(int64_t lo, int64_t hi) const {
    if (lo < 0 || hi > leaves() || lo >= hi) return -1;
    int64_t id = kRoot;
    while (nodes_[id].lo != lo || nodes_[id].hi != hi) {
      const Node& n = nodes_[id];
      if (n.left < 0) return -1;
      const int64_t mid = nodes_[n.left].hi;
      if (hi <= mid) {
        id = n.left;
      } else if (lo >= mid) {
        id = n.right;
      } else {
        return -1;
      }
    }
    return id;
  }

 private:
  int64_t Build(int64_t lo, int64_t hi, int64_t parent) {
    const int64_t id = size();
    nodes_.push_back({lo, hi, parent, -1, -1});
    if (hi - lo == 1) {
      leaf_[lo] = id;
    } else {
      const int64_t mid = lo + (hi - lo) / 2;
      const int64_t left = Build(lo, mid, id);
      const int64_t right = Build(mid, hi, id);
      nodes_[id].left = left;
      nodes_[id].right = right;
    }
    return id;
  }

  std::vector<Node> nodes_;
  std::vector<int64_t> leaf_;  // span -> node
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPAN_TREE_H_
