#include "engine/reduce_groups.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "engine/families/families.h"
#include "engine/span_work.h"

namespace adjsh {
namespace {

constexpr char kValue[] = "value";

// The head's, lookups' and norm_f's groups after the K layers' (slots: the layer's own list).
template <typename Config, typename Slots>
GroupLayout LayoutOf(const Config& c, const Slots& slots) {
  GroupLayout l;
  l.K = c.num_hidden_layers;
  for (int64_t k = 0; k < l.K; ++k) {
    std::vector<GroupSlot>& g = l.groups.emplace_back();
    for (const auto& slot : slots) g.push_back({LayerParamName(k, slot.suffix), slot.shape(c)});
  }
  l.groups.push_back({{kValue, {c.vocab_size, c.hidden_size}}});  // the head
  l.groups.push_back({{kValue, {c.vocab_size, c.hidden_size}}});  // the lookups
  l.groups.push_back({{kValue, {c.hidden_size}}});                // norm_f
  l.tied = c.tie_word_embeddings;
  if (l.tied) l.groups.push_back({{kValue, {c.vocab_size, c.hidden_size}}});  // head + lookup
  return l;
}

const std::vector<GroupSlot>* SlotsOf(const GroupLayout& l, int32_t group) {
  if (group < 0 || static_cast<size_t>(group) >= l.groups.size()) return nullptr;
  return &l.groups[static_cast<size_t>(group)];
}

}  // namespace

std::string GroupName(int32_t group, int64_t K) {
  if (group >= 0 && group < K) return absl::StrCat("layer ", group);
  if (group == HeadGroup(K)) return "head";
  if (group == LookupGroup(K)) return "lookup";
  if (group == NormFGroup(K)) return "norm_f";
  if (group == TiedEmbedGroup(K)) return "head + lookup";
  return absl::StrCat("group ", group);
}

GroupLayout GroupLayout::Of(const MambaConfig& c) { return LayoutOf(c, LayerParamSlots<float>()); }
GroupLayout GroupLayout::Of(const Mamba2Config& c) {
  return LayoutOf(c, Mamba2LayerSlots<float>());
}

template <typename T, typename Layer>
std::vector<GroupLeaf<T>> TakeLeaves(const SpanTask& task, int64_t K,
                                     SpanOutputs<T, Layer>& out) {
  std::vector<GroupLeaf<T>> leaves;
  // The (V, D) partial: on the device, or on the host.
  auto embed = [&out](int32_t group) {
    GroupLeaf<T> leaf{group, {}, std::move(out.embed_sum)};
    if (leaf.device.size() == 0) leaf.value.push_back(std::move(out.embed));
    out.embed.clear();
    return leaf;
  };
  if (task.phase == SpanPhase::kForward && task.layer + 1 == K) {
    leaves.push_back(embed(HeadGroup(K)));
    leaves.push_back({NormFGroup(K), {std::move(out.norm_f)}, {}});
    out.norm_f.clear();
  } else if (task.phase == SpanPhase::kBackward) {
    GroupLeaf<T> layer{static_cast<int32_t>(task.layer), {}, std::move(out.grad_sum)};
    for (const auto& slot : FamilyOf<Layer>::template LayerSlots<T>()) {
      if (layer.device.size() == 0) layer.value.push_back(std::move(out.grad.*slot.member));
      (out.grad.*slot.member).clear();
    }
    leaves.push_back(std::move(layer));
    if (task.layer == 0) leaves.push_back(embed(LookupGroup(K)));
  }
  return leaves;
}

template <typename T>
void AddGroupValue(GroupValue<T>& left, const GroupValue<T>& right) {
  ADJSH_CHECK(left.size() == right.size(), "group values of different groups");
  for (size_t j = 0; j < left.size(); ++j) {
    std::vector<T>& x = left[j];
    const std::vector<T>& y = right[j];
    ADJSH_CHECK(x.size() == y.size(), "group tensors of different sizes");
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
}

TensorMap PutGroup(const GroupLayout& l, int32_t group, const GroupValue<float>& v) {
  TensorMap out;
  const std::vector<GroupSlot>* slots = SlotsOf(l, group);
  ADJSH_CHECK(slots != nullptr && slots->size() == v.size(), "a group value of another group");
  for (size_t j = 0; j < slots->size(); ++j)
    out.emplace((*slots)[j].name, HostTensor::From<float>(v[j], (*slots)[j].shape, DType::kF32));
  return out;
}

absl::StatusOr<GroupValue<float>> TakeGroup(const GroupLayout& l, int32_t group,
                                            TensorMap& got) {
  const std::vector<GroupSlot>* slots = SlotsOf(l, group);
  if (slots == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group, " is not one of the step's ", l.groups.size()));
  }
  const std::string what = GroupName(group, l.K);
  GroupValue<float> v;
  for (const GroupSlot& slot : *slots) {
    auto it = got.find(slot.name);
    if (it == got.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": missing tensor \"", slot.name, "\""));
    }
    if (it->second.dtype != DType::kF32 || it->second.shape != slot.shape) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": tensor \"", slot.name,
                                                     "\" must be F32 of shape (",
                                                     absl::StrJoin(slot.shape, ", "), ")"));
    }
    if (!ValidateTensor(it->second).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor \"", slot.name, "\" is malformed"));
    }
    absl::StatusOr<std::vector<float>> values = it->second.To<float>();
    if (!values.ok()) return values.status();
    v.push_back(*std::move(values));
    got.erase(it);
  }
  if (!got.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unexpected tensor \"", got.begin()->first, "\""));
  }
  return v;
}

size_t MaxGroupTensors() {
  return std::max(LayerParamSlots<float>().size(), Mamba2LayerSlots<float>().size());
}

uint64_t GroupBytes(const GroupLayout& l, int32_t group) {
  uint64_t n = 0;
  if (const std::vector<GroupSlot>* slots = SlotsOf(l, group))
    for (const GroupSlot& slot : *slots) n += 4 * static_cast<uint64_t>(ShapeNumel(slot.shape));
  return n;
}

#define ADJSH_REDUCE_GROUPS(T)                                                                 \
  template std::vector<GroupLeaf<T>> TakeLeaves<T>(const SpanTask&, int64_t,                   \
                                                  SpanOutputs<T, LayerParams<T>>&);            \
  template std::vector<GroupLeaf<T>> TakeLeaves<T>(const SpanTask&, int64_t,                   \
                                                  SpanOutputs<T, Mamba2Layer<T>>&);            \
  template void AddGroupValue<T>(GroupValue<T>&, const GroupValue<T>&);
ADJSH_REDUCE_GROUPS(float)
ADJSH_REDUCE_GROUPS(double)
#undef ADJSH_REDUCE_GROUPS

}  // namespace adjsh
