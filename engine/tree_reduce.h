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
//   r.SetDevice(&space, sizes);  r.PutLeaf(group, s, {}, std::move(device_leaf), out);
//   r.Put(group, lo, hi, value, out);   // a node a peer pushed
//   for (auto& send : out) ...          // to peer send.to, or the coordinator (kCoordinator)
//
// A node put twice is dropped (*fresh = false): a retried task or push brings the same bits.
//
// On a resident GPU worker the leaves stay where the rows are (PutLeaf with a device buffer,
// after SetDevice): nodes summed from this worker's own leaves are summed there, each element
// one f32 add as on the host, and a node comes to the host only when it leaves the worker or
// meets a peer's node (then it is added on the host, the same bits). So a worker that owns a
// whole subtree brings its root down once per group and step, not one partial per task.
//
// A tied model's head and lookups' roots (both computed by the owner of span 0) leave as one,
// head + lookup, as the coordinator's ledger would add them (TieEmbedRoots, TiedEmbedGroup):
// one (V, D) value crosses, not two.
// Not thread-safe.
#ifndef ADJSH_ENGINE_TREE_REDUCE_H_
#define ADJSH_ENGINE_TREE_REDUCE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/reduce_groups.h"
#include "engine/span_tree.h"
#include "kernels/row_space.h"

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
      : tree_(spans),
        owner_(std::move(span_owner)),
        self_(self),
        K_(layers),
        groups_(NumGroups(layers)) {}

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
    return Add(group, id, Value{std::move(value), RowBuffer<T>()}, out, fresh);
  }

  // A tied model: the head's and lookups' roots go to the coordinator as their sum.
  void TieEmbedRoots() { tied_ = true; }

  // Where device leaves are: space, and each group's tensor sizes (floats, in its order), by
  // which a flat device value is split into a GroupValue.
  void SetDevice(RowSpace<T>* space, std::vector<std::vector<size_t>> group_sizes) {
    space_ = space;
    sizes_ = std::move(group_sizes);
  }

  // The partial of span s, which this worker owns and computed: a leaf, on the host (value) or
  // on the device (a non-empty device, after SetDevice). INVALID_ARGUMENT for a span it does
  // not own, or a device leaf of the wrong size; else as Put.
  absl::Status PutLeaf(int32_t group, int64_t s, GroupValue<T> value, std::vector<Send>& out,
                       bool* fresh = nullptr) {
    return PutLeaf(group, s, std::move(value), RowBuffer<T>(), out, fresh);
  }
  absl::Status PutLeaf(int32_t group, int64_t s, GroupValue<T> value, RowBuffer<T> device,
                       std::vector<Send>& out, bool* fresh = nullptr) {
    const int64_t id = tree_.Find(s, s + 1);
    if (absl::Status st = CheckNode(group, s, s + 1, id); !st.ok()) return st;
    if (owner_[s] != self_) {
      return absl::InvalidArgumentError(
          absl::StrCat("span ", s, " is not worker ", self_, "'s: its leaf is not computed here"));
    }
    if (device.size() > 0 && (space_ == nullptr || device.size() != Floats(group))) {
      return absl::InvalidArgumentError(
          absl::StrCat("a device leaf of group ", group, " with ", device.size(),
                       " values, not ", space_ == nullptr ? size_t{0} : Floats(group)));
    }
    return Add(group, id, Value{std::move(value), std::move(device)}, out, fresh);
  }

  // Nodes waiting for a sibling, over every group (and a tied root for the other).
  int64_t held() const {
    int64_t n = (tied_roots_[0] ? 1 : 0) + (tied_roots_[1] ? 1 : 0);
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

  // A node's value: on the host, or (non-empty device) flat on the device.
  struct Value {
    GroupValue<T> host;
    RowBuffer<T> device;
  };

  size_t Floats(int32_t group) const {
    size_t n = 0;
    for (size_t t : sizes_.at(group)) n += t;
    return n;
  }
  // v on the host: its device buffer split into the group's tensors, brought down (one wait).
  void ToHost(int32_t group, Value& v) {
    if (v.device.size() == 0) return;
    const T* p = v.device.data();
    v.host.clear();
    for (size_t t : sizes_.at(group)) {
      v.host.emplace_back(t);
      space_->Download(v.host.back().data(), p, t);
      p += t;
    }
    space_->Finish();
    v.device.reset();
  }
  // left += right, where both are: on the device, else on the host.
  void AddValue(int32_t group, Value& left, Value& right) {
    if (left.device.size() > 0 && right.device.size() > 0)
      return space_->Add(left.device.data(), right.device.data(), left.device.size());
    ToHost(group, left);
    ToHost(group, right);
    AddGroupValue(left.host, right.host);
  }

  // Node id's value, summed up the tree as far as this worker can; what leaves it, into out.
  absl::Status Add(int32_t group, int64_t id, Value value, std::vector<Send>& out, bool* fresh) {
    if (fresh != nullptr) *fresh = false;
    if (!seen_[group].emplace(id, true).second) return absl::OkStatus();
    if (fresh != nullptr) *fresh = true;
    for (;;) {
      const SpanTree::Node& n = tree_.node(id);
      const int32_t to = Target(id);
      if (to == kCoordinator && tied_ && (group == HeadGroup(K_) || group == LookupGroup(K_)))
        return TiedRoot(group, std::move(value), out);
      if (to != self_) {  // the root (to the coordinator), or a right child of another's node
        ToHost(group, value);
        out.push_back({group, n.lo, n.hi, to, std::move(value.host)});
        return absl::OkStatus();
      }
      const SpanTree::Node& p = tree_.node(n.parent);
      const bool left = p.left == id;
      auto sibling = held_[group].find(left ? p.right : p.left);
      if (sibling == held_[group].end()) {
        held_[group].emplace(id, std::move(value));
        return absl::OkStatus();
      }
      Value sum;
      if (left) {
        sum = std::move(value);
        AddValue(group, sum, sibling->second);
      } else {
        sum = std::move(sibling->second);
        AddValue(group, sum, value);
      }
      held_[group].erase(sibling);
      id = n.parent;
      if (!seen_[group].emplace(id, true).second) return absl::OkStatus();
      value = std::move(sum);
    }
  }

  // The head's or the lookups' root; with both in, head + lookup to the coordinator.
  absl::Status TiedRoot(int32_t group, Value value, std::vector<Send>& out) {
    tied_roots_[group == HeadGroup(K_) ? 0 : 1] = std::move(value);
    if (!tied_roots_[0] || !tied_roots_[1]) return absl::OkStatus();
    Value sum = *std::move(tied_roots_[0]);
    AddValue(HeadGroup(K_), sum, *tied_roots_[1]);
    tied_roots_[0].reset(), tied_roots_[1].reset();
    ToHost(HeadGroup(K_), sum);
    out.push_back({TiedEmbedGroup(K_), 0, tree_.leaves(), kCoordinator, std::move(sum.host)});
    return absl::OkStatus();
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
  int64_t K_;
  int32_t groups_;
  bool tied_ = false;
  std::optional<Value> tied_roots_[2];  // the head's, the lookups' (TieEmbedRoots)
  RowSpace<T>* space_ = nullptr;            // where device leaves are (SetDevice)
  std::vector<std::vector<size_t>> sizes_;  // per group, its tensors' floats
  std::map<int32_t, std::map<int64_t, Value>> held_;  // group -> node -> value
  std::map<int32_t, std::map<int64_t, bool>> seen_;           // group -> nodes put or made
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_TREE_REDUCE_H_
