// One worker's part of a step's worker-tree reduction (docs/ARCHITECTURE.md "The worker
// tree"): the sums of the span tree (engine/span_tree.h) whose nodes this worker computes. Node
// [lo, hi) is computed by the owner of span lo; so a node's value goes to the owner of its
// parent's lo (its own owner for a left child, possibly another worker for a right one), and
// the root's to the coordinator. Each node is left + right in that order (AddGroupValue), as
// the coordinator's FixedTreeSum adds: the same bits wherever a node is computed.
//
//   TreeReduce<float> r(S, span_owner, self, K);
//   std::vector<TreeReduce<float>::Send> out;
//   r.PutLeaf(group, s, leaf, out);    // a partial of an owned span, computed here
//   r.Put(group, lo, hi, value, out);   // a node a peer pushed
//   for (auto& send : out) ...          // to peer send.to, or the coordinator (kCoordinator)
//
// A node put twice is dropped (*fresh = false): a retried task or push brings the same bits.
// Not thread-safe.
#ifndef ADJSH_ENGINE_TREE_REDUCE_H_
#define ADJSH_ENGINE_TREE_REDUCE_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/reduce_groups.h"
#include "engine/span_tree.h"

namespace adjsh {

template <typename T>
class TreeReduce {
 public:
  static constexpr int32_t kCoordinator = -1;
  struct Send {
    int32_t group;
    int64_t lo, hi;
    int32_t to;  // a worker index, or kCoordinator
    GroupValue<T> value;
  };

  // span_owner[s]: the index of span s's owner; self: this worker's index.
  TreeReduce(int64_t spans, std::vector<int32_t> span_owner, int32_t self, int64_t layers)
      : tree_(spans), owner_(std::move(span_owner)), self_(self), groups_(NumGroups(layers)) {}

  // A node a peer pushed. INVALID_ARGUMENT for a node that is not in the tree, not this
  // worker's to receive, or one this worker computes itself (a node is computed by the owner of
  // its first span: accepted from a peer first, the real one would be dropped as a duplicate);
  // otherwise OK, with *fresh = false for one put already.
  absl::Status Put(int32_t group, int64_t lo, int64_t hi, GroupValue<T> value,
                   std::vector<Send>& out, bool* fresh = nullptr) {
    const int64_t id = tree_.Find(lo, hi);
    if (absl::Status s = CheckNode(group, lo, hi, id); !s.ok()) return s;
    if (Target(id) != self_ || owner_[lo] == self_) {
      return absl::InvalidArgumentError(absl::StrCat("node [", lo, ", ", hi, ") of group ", group,
                                                     " is not worker ", self_, "'s to receive"));
    }
    return Add(group, id, std::move(value), out, fresh);
  }

  // The partial of span s, which this worker owns and computed: a leaf. INVALID_ARGUMENT for
  // a span it does not own; else as Put.
  absl::Status PutLeaf(int32_t group, int64_t s, GroupValue<T> value, std::vector<Send>& out,
                       bool* fresh = nullptr) {
    const int64_t id = tree_.Find(s, s + 1);
    if (absl::Status st = CheckNode(group, s, s + 1, id); !st.ok()) return st;
    if (owner_[s] != self_) {
      return absl::InvalidArgumentError(
          absl::StrCat("span ", s, " is not worker ", self_, "'s: its leaf is not computed here"));
    }
    return Add(group, id, std::move(value), out, fresh);
  }

  // Nodes waiting for a sibling, over every group.
  int64_t held() const {
    int64_t n = 0;
    for (const auto& [g, nodes] : held_) n += static_cast<int64_t>(nodes.size());
    return n;
  }

 private:
  absl::Status CheckNode(int32_t group, int64_t lo, int64_t hi, int64_t id) const {
    if (group < 0 || group >= groups_ || id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("no node [", lo, ", ", hi, ") of group ",
                                                     group, " in the tree of ", tree_.leaves(),
                                                     " spans"));
    }
    return absl::OkStatus();
  }

  // Node id's value, summed up the tree as far as this worker can; what leaves it, into out.
  absl::Status Add(int32_t group, int64_t id, GroupValue<T> value, std::vector<Send>& out,
                   bool* fresh) {
    if (fresh != nullptr) *fresh = false;
    if (!seen_[group].emplace(id, true).second) return absl::OkStatus();
    if (fresh != nullptr) *fresh = true;
    for (;;) {
      const SpanTree::Node& n = tree_.node(id);
      const int32_t to = Target(id);
      if (to != self_) {  // the root (to the coordinator), or a right child of another's node
        out.push_back({group, n.lo, n.hi, to, std::move(value)});
        return absl::OkStatus();
      }
      const SpanTree::Node& p = tree_.node(n.parent);
      const bool left = p.left == id;
      auto sibling = held_[group].find(left ? p.right : p.left);
      if (sibling == held_[group].end()) {
        held_[group].emplace(id, std::move(value));
        return absl::OkStatus();
      }
      GroupValue<T> sum;
      if (left) {
        sum = std::move(value);
        AddGroupValue(sum, sibling->second);
      } else {
        sum = std::move(sibling->second);
        AddGroupValue(sum, value);
      }
      held_[group].erase(sibling);
      id = n.parent;
      if (!seen_[group].emplace(id, true).second) return absl::OkStatus();
      value = std::move(sum);
    }
  }

  // Who sums node id's value into its parent: the owner of the parent's first span; the
  // coordinator for the root.
  int32_t Target(int64_t id) const {
    const int64_t parent = tree_.node(id).parent;
    return parent < 0 ? kCoordinator : owner_[tree_.node(parent).lo];
  }

  SpanTree tree_;
  std::vector<int32_t> owner_;
  int32_t self_;
  int32_t groups_;
  std::map<int32_t, std::map<int64_t, GroupValue<T>>> held_;  // group -> node -> value
  std::map<int32_t, std::map<int64_t, bool>> seen_;           // group -> nodes put or made
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_TREE_REDUCE_H_
