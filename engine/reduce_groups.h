// The parameter partials of a span step as reduction groups: what each leaf of the span tree
// (engine/span_tree.h) carries, how two nodes add, and their wire form. Per step there are
// K + 3 groups, each summed over the S spans:
//   group k, 0..K-1   layer k's partial (kBackward of layer k), its tensors in LayerParamSlots
//                     order
//   group K           the LM head's (V, D) partial (kForward at the top layer)
//   group K + 1       the embedding lookups' (V, D) partial (kBackward of layer 0)
//   group K + 2       norm_f's (D) partial (kForward at the top layer)
// and, for a tied model, one more that is no tree's: TiedEmbedGroup K + 3, the head's and the
// lookups' roots added (head + lookup), which the worker tree sends the coordinator in their
// place (engine/tree_reduce.h TieEmbedRoots).
// On the wire (PushSum, PushReduced) a layer's node is its tensors under their Hugging Face
// names, another group's the one tensor "value", in f32.
#ifndef ADJSH_ENGINE_REDUCE_GROUPS_H_
#define ADJSH_ENGINE_REDUCE_GROUPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/mamba2_config.h"
#include "common/model.h"
#include "common/safetensors.h"
#include "engine/span_plan.h"
#include "kernels/row_space.h"

namespace adjsh {

template <typename T, typename Layer>
struct SpanOutputs;

// A node's value: the group's tensors, flat, in the group's order.
template <typename T>
using GroupValue = std::vector<std::vector<T>>;

inline int32_t NumGroups(int64_t K) { return static_cast<int32_t>(K + 3); }
inline int32_t HeadGroup(int64_t K) { return static_cast<int32_t>(K); }
inline int32_t LookupGroup(int64_t K) { return static_cast<int32_t>(K + 1); }
inline int32_t NormFGroup(int64_t K) { return static_cast<int32_t>(K + 2); }
inline int32_t TiedEmbedGroup(int64_t K) { return static_cast<int32_t>(K + 3); }
// "layer 3", "head", "lookup", "norm_f", "head + lookup"
std::string GroupName(int32_t group, int64_t K);

// A leaf: its value on the host, or (a resident span's partial left where its rows are:
// SpanOutputs::embed_sum, grad_sum) `device`, the group's tensors back to back in its order.
template <typename T>
struct GroupLeaf {
  int32_t group;
  GroupValue<T> value;
  RowBuffer<T> device;
};

// Moves the partials out of a task's outputs (summaries and forwards below the top carry none),
// a layer's tensors in its slot order (LayerParamSlots, Mamba2LayerSlots); those left on the
// device stay there (GroupLeaf::device).
template <typename T, typename Layer>
std::vector<GroupLeaf<T>> TakeLeaves(const SpanTask& task, int64_t K,
                                     SpanOutputs<T, Layer>& out);

// left += right, element by element, tensor by tensor: the ledger's adds (common/model.h
// AddInto), so that a node has the same bits wherever it is computed.
template <typename T>
void AddGroupValue(GroupValue<T>& left, const GroupValue<T>& right);

// The wire form of a step's groups, for a model of either type: each group's tensors, named
// and shaped (a layer's under its HF names, the others "value").
struct GroupSlot {
  std::string name;
  std::vector<int64_t> shape;
};
struct GroupLayout {
  int64_t K = 0;
  bool tied = false;                           // tie_word_embeddings
  std::vector<std::vector<GroupSlot>> groups;  // NumGroups(K), and TiedEmbedGroup(K) when tied
  static GroupLayout Of(const MambaConfig& c);
  static GroupLayout Of(const Mamba2Config& c);
};

// TakeGroup checks every name, shape and dtype (INVALID_ARGUMENT naming the tensor) and that
// nothing else is there. f32.
TensorMap PutGroup(const GroupLayout& l, int32_t group, const GroupValue<float>& v);
absl::StatusOr<GroupValue<float>> TakeGroup(const GroupLayout& l, int32_t group, TensorMap& got);
uint64_t GroupBytes(const GroupLayout& l, int32_t group);  // f32
// The most tensors a group carries, for either model type (a layer's), for the stream limits
// of PushSum and PushReduced.
size_t MaxGroupTensors();

}  // namespace adjsh

#endif  // ADJSH_ENGINE_REDUCE_GROUPS_H_
