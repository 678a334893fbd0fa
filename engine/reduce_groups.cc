#include "engine/reduce_groups.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "engine/span_work.h"

namespace adjsh {
namespace {

constexpr char kValue[] = "value";

struct GroupSlot {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<GroupSlot> GroupSlots(const MambaConfig& c, int64_t K, int32_t group) {
  std::vector<GroupSlot> slots;
  if (group >= 0 && group < K) {
    for (const auto& slot : LayerParamSlots<float>())
      slots.push_back({LayerParamName(group, slot.suffix), slot.shape(c)});
  } else if (group == HeadGroup(K) || group == LookupGroup(K)) {
    slots.push_back({kValue, {c.vocab_size, c.hidden_size}});
  } else if (group == NormFGroup(K)) {
    slots.push_back({kValue, {c.hidden_size}});
  }
  return slots;
}

}  // namespace

std::string GroupName(int32_t group, int64_t K) {
  if (group >= 0 && group < K) return absl::StrCat("layer ", group);
  if (group == HeadGroup(K)) return "head";
  if (group == LookupGroup(K)) return "lookup";
  if (group == NormFGroup(K)) return "norm_f";
  return absl::StrCat("group ", group);
}

template <typename T>
std::vector<GroupLeaf<T>> TakeLeaves(const SpanTask& task, int64_t K,
                                     SpanOutputs<T, LayerParams<T>>& out) {
  std::vector<GroupLeaf<T>> leaves;
  if (task.phase == SpanPhase::kForward && task.layer + 1 == K) {
    leaves.push_back({HeadGroup(K), {std::move(out.embed)}});
    leaves.push_back({NormFGroup(K), {std::move(out.norm_f)}});
    out.embed.clear();
    out.norm_f.clear();
  } else if (task.phase == SpanPhase::kBackward) {
    GroupValue<T> layer;
    for (const auto& slot : LayerParamSlots<T>()) {
      layer.push_back(std::move(out.grad.*slot.member));
      (out.grad.*slot.member).clear();
    }
    leaves.push_back({static_cast<int32_t>(task.layer), std::move(layer)});
    if (task.layer == 0) {
      leaves.push_back({LookupGroup(K), {std::move(out.embed)}});
      out.embed.clear();
    }
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

template <typename T>
LayerParams<T> LayerFromGroup(GroupValue<T>&& v) {
  LayerParams<T> p;
  const auto& slots = LayerParamSlots<T>();
  ADJSH_CHECK(v.size() == slots.size(), "a layer group has one tensor per layer parameter");
  for (size_t j = 0; j < slots.size(); ++j) p.*slots[j].member = std::move(v[j]);
  return p;
}

TensorMap PutGroup(const MambaConfig& c, int64_t K, int32_t group, const GroupValue<float>& v) {
  TensorMap out;
  const std::vector<GroupSlot> slots = GroupSlots(c, K, group);
  ADJSH_CHECK(slots.size() == v.size(), "a group value of another group");
  for (size_t j = 0; j < slots.size(); ++j)
    out.emplace(slots[j].name, HostTensor::From<float>(v[j], slots[j].shape, DType::kF32));
  return out;
}

absl::StatusOr<GroupValue<float>> TakeGroup(const MambaConfig& c, int64_t K, int32_t group,
                                            TensorMap& got) {
  const std::vector<GroupSlot> slots = GroupSlots(c, K, group);
  if (slots.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group, " is not one of the step's ", NumGroups(K)));
  }
  GroupValue<float> v;
  for (const GroupSlot& slot : slots) {
    auto it = got.find(slot.name);
    if (it == got.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(GroupName(group, K), ": missing tensor \"", slot.name, "\""));
    }
    if (it->second.dtype != DType::kF32 || it->second.shape != slot.shape) {
      return absl::InvalidArgumentError(absl::StrCat(GroupName(group, K), ": tensor \"", slot.name,
                                                     "\" must be F32 of shape (",
                                                     absl::StrJoin(slot.shape, ", "), ")"));
    }
    if (!ValidateTensor(it->second).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(GroupName(group, K), ": tensor \"", slot.name, "\" is malformed"));
    }
    absl::StatusOr<std::vector<float>> values = it->second.To<float>();
    if (!values.ok()) return values.status();
    v.push_back(*std::move(values));
    got.erase(it);
  }
  if (!got.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(GroupName(group, K), ": unexpected tensor \"", got.begin()->first, "\""));
  }
  return v;
}

uint64_t GroupBytes(const MambaConfig& c, int64_t K, int32_t group) {
  uint64_t n = 0;
  for (const GroupSlot& slot : GroupSlots(c, K, group))
    n += 4 * static_cast<uint64_t>(ShapeNumel(slot.shape));
  return n;
}

#define ADJSH_REDUCE_GROUPS(T)                                                                 \
  template std::vector<GroupLeaf<T>> TakeLeaves<T>(const SpanTask&, int64_t,                   \
                                                  SpanOutputs<T, LayerParams<T>>&);            \
  template void AddGroupValue<T>(GroupValue<T>&, const GroupValue<T>&);                        \
  template LayerParams<T> LayerFromGroup<T>(GroupValue<T> &&);
ADJSH_REDUCE_GROUPS(float)
ADJSH_REDUCE_GROUPS(double)
#undef ADJSH_REDUCE_GROUPS

}  // namespace adjsh
