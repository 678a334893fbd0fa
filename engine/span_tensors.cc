#include "engine/span_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace adjsh {
namespace {

constexpr char kTokens[] = "tokens";
constexpr char kMask[] = "mask";
constexpr char kComputeSeconds[] = "compute_seconds";
constexpr char kRebuildSeconds[] = "rebuild_seconds";
constexpr char kDeviceTraffic[] = "device_traffic";
constexpr char kLossSum[] = "loss_sum";
constexpr char kCorrect[] = "correct";

template <typename T>
DType DTypeOf() {
  return sizeof(T) == 8 ? DType::kF64 : DType::kF32;
}

// One tensor of a task: its name, shape and where its values live.
template <typename T>
struct Slot {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<T>* values;
};

template <typename T, typename C>
std::vector<Slot<T>> InputSlots(const C& c, const SpanPlan& plan, const SpanTask& t,
                                SpanInputs<T>& in) {
  const int64_t D = c.hidden_size, Di = c.inner(), N = c.state_size;
  const int64_t K = plan.layers(), S = plan.spans(), k = t.layer, s = t.span;
  std::vector<Slot<T>> slots;
  const bool forward = t.phase == SpanPhase::kForwardSummary || t.phase == SpanPhase::kForward;
  if (forward) {
    if (k > 0 && s > 0) slots.push_back({"halo_u", {plan.range(s).halo, D}, &in.halo_u});
    if (t.phase == SpanPhase::kForward && s > 0) slots.push_back({"h0", {Di, N}, &in.h0});
  } else {
    if (k + 1 < K && s + 1 < S)
      slots.push_back({"du_halo", {plan.range(s + 1).halo, D}, &in.du_halo});
    if (t.phase == SpanPhase::kBackward && s + 1 < S) slots.push_back({"mu", {Di, N}, &in.mu});
  }
  return slots;
}

template <typename T, typename C>
std::vector<Slot<T>> OutputSlots(const C& c, const SpanPlan& plan, const SpanTask& t,
                                 SpanOutputs<T, typename Family<C>::template Layer<T>>& out,
                                 bool partials = true) {
  const int64_t D = c.hidden_size, Di = c.inner(), N = c.state_size, V = c.vocab_size;
  const int64_t K = plan.layers(), k = t.layer;
  const SpanRange& r = plan.range(t.span);
  std::vector<Slot<T>> slots;
  switch (t.phase) {
    case SpanPhase::kForwardSummary:
      slots.push_back({"sigma", {Di}, &out.sigma});
      slots.push_back({"h_end", {Di, N}, &out.h_end});
      break;
    case SpanPhase::kForward:
      if (k + 1 < K) {
        slots.push_back({"halo_next", {std::min(c.conv_kernel - 1, r.len), D}, &out.halo_next});
      } else if (partials && !plan.forward_only()) {  // a forward-only head: the loss alone
        slots.push_back({kEmbedName, {V, D}, &out.embed});
        slots.push_back({kNormFName, {D}, &out.norm_f});
      }
      break;
    case SpanPhase::kBackwardSummary:
      slots.push_back({"m", {Di, N}, &out.m});
      break;
    case SpanPhase::kBackward:
      if (partials) {
        for (const auto& slot : Family<C>::template LayerSlots<T>())
          slots.push_back(
              {LayerParamName(k, slot.suffix), slot.shape(c), &(out.grad.*slot.member)});
      }
      slots.push_back({"du_halo_prev", {r.halo, D}, &out.du_halo_prev});
      if (k == 0 && partials) slots.push_back({kEmbedName, {V, D}, &out.embed});
      break;
  }
  return slots;
}

// Moves `name` out of `got` as T values, checking presence, dtype and shape.
template <typename T>
absl::Status Take(TensorMap& got, const std::string& name, const std::vector<int64_t>& shape,
                  DType dtype, std::vector<T>& dst) {
  auto it = got.find(name);
  if (it == got.end()) return absl::InvalidArgumentError(absl::StrCat("missing tensor \"", name, "\""));
  if (it->second.dtype != dtype || it->second.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", name, "\" is ", std::string(DTypeName(it->second.dtype)),
        ShapeString(it->second.shape), ", expected ", std::string(DTypeName(dtype)),
        ShapeString(shape)));
  }
  absl::StatusOr<std::vector<T>> v = it->second.To<T>();
  if (!v.ok()) return v.status();
  dst = std::move(*v);
  got.erase(it);
  return absl::OkStatus();
}

// A scalar of raw bytes: I64 or F64.
template <typename V>
HostTensor Scalar(V value, DType dtype) {
  HostTensor t;
  t.dtype = dtype;
  t.data.resize(sizeof(V));
  std::memcpy(t.data.data(), &value, sizeof(V));
  return t;
}

// DeviceTraffic's six counts as I64 (6), in its order.
HostTensor TrafficTensor(const DeviceTraffic& d) {
  const uint64_t v[6] = {d.h2d_bytes, d.d2h_bytes, d.h2d_copies, d.d2h_copies, d.syncs,
                         d.allocations};
  HostTensor t;
  t.dtype = DType::kI64;
  t.shape = {6};
  t.data.resize(sizeof(v));
  std::memcpy(t.data.data(), v, sizeof(v));
  return t;
}

absl::StatusOr<DeviceTraffic> TakeTraffic(TensorMap& got) {
  auto it = got.find(kDeviceTraffic);
  if (it == got.end() || it->second.dtype != DType::kI64 ||
      it->second.shape != std::vector<int64_t>{6} || it->second.data.size() != 6 * sizeof(int64_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a result needs \"", kDeviceTraffic, "\" I64(6)"));
  }
  int64_t v[6];
  std::memcpy(v, it->second.data.data(), sizeof(v));
  for (int64_t x : v) {
    if (x < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", kDeviceTraffic, "\" has a negative count"));
    }
  }
  got.erase(it);
  DeviceTraffic d;
  d.h2d_bytes = v[0], d.d2h_bytes = v[1], d.h2d_copies = v[2], d.d2h_copies = v[3];
  d.syncs = v[4], d.allocations = v[5];
  return d;
}

template <typename V>
absl::StatusOr<V> TakeScalar(TensorMap& got, const std::string& name, DType dtype) {
  auto it = got.find(name);
  if (it == got.end()) return absl::InvalidArgumentError(absl::StrCat("missing tensor \"", name, "\""));
  if (it->second.dtype != dtype || !it->second.shape.empty() ||
      it->second.data.size() != sizeof(V)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" must be a ",
                                                   std::string(DTypeName(dtype)), " scalar"));
  }
  V v;
  std::memcpy(&v, it->second.data.data(), sizeof(V));
  got.erase(it);
  return v;
}

template <typename T>
std::string Scan(const std::string& name, const std::vector<T>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) return absl::StrCat(name, "[", i, "] = ", v[i]);
  return "";
}

}  // namespace

std::string ReplayPrefix(const SpanTask& task) {
  return absl::StrCat("replay.", std::string(SpanPhaseName(task.phase)), ".", task.layer, ".");
}

template <typename T, typename C>
void PutSpanInputs(const C& c, const SpanPlan& plan, const SpanTask& task,
                   const SpanInputs<T>& in, const std::string& prefix, TensorMap& out) {
  SpanInputs<T>& values = const_cast<SpanInputs<T>&>(in);  // read only: slots hold pointers
  for (const Slot<T>& slot : InputSlots(c, plan, task, values))
    out.emplace(prefix + slot.name, HostTensor::From<T>(*slot.values, slot.shape, DTypeOf<T>()));
}

template <typename T, typename C>
absl::StatusOr<SpanInputs<T>> TakeSpanInputs(const C& c, const SpanPlan& plan,
                                             const SpanTask& task, const std::string& prefix,
                                             TensorMap& got) {
  SpanInputs<T> in;
  for (const Slot<T>& slot : InputSlots(c, plan, task, in)) {
    if (absl::Status s = Take(got, prefix + slot.name, slot.shape, DTypeOf<T>(), *slot.values);
        !s.ok())
      return s;
  }
  return in;
}

void PutSpanStart(const std::vector<uint32_t>& tokens, const std::vector<uint8_t>& mask,
                  TensorMap& out) {
  HostTensor t;
  t.dtype = DType::kI64;
  t.shape = {static_cast<int64_t>(tokens.size())};
  t.data.resize(tokens.size() * sizeof(int64_t));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t id = tokens[i];
    std::memcpy(t.data.data() + i * sizeof(int64_t), &id, sizeof(int64_t));
  }
  out.emplace(kTokens, std::move(t));
  if (mask.empty()) return;
  HostTensor m;
  m.dtype = DType::kU8;
  m.shape = {static_cast<int64_t>(mask.size())};
  m.data = mask;
  out.emplace(kMask, std::move(m));
}

template <typename C>
absl::Status TakeSpanStart(const C& c, const SpanPlan& plan, int64_t s, bool masked,
                           TensorMap& got, std::vector<uint32_t>& tokens,
                           std::vector<uint8_t>& mask) {
  const SpanRange& r = plan.range(s);
  const int64_t n = std::min(plan.T(), r.t0 + r.len + 1) - (r.t0 - r.halo);
  auto it = got.find(kTokens);
  if (it == got.end() || it->second.dtype != DType::kI64 ||
      it->second.shape != std::vector<int64_t>{n}) {
    return absl::InvalidArgumentError(
        absl::StrCat("span ", s, " needs \"tokens\" I64(", n, ")"));
  }
  tokens.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t id = 0;
    std::memcpy(&id, it->second.data.data() + i * sizeof(int64_t), sizeof(int64_t));
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", id, " at ", i, " of span ", s, " is outside the vocabulary"));
    }
    tokens[i] = static_cast<uint32_t>(id);
  }
  got.erase(it);
  mask.clear();
  auto m = got.find(kMask);
  if (masked != (m != got.end())) {
    return absl::InvalidArgumentError(masked ? "the job has a loss mask: \"mask\" is missing"
                                             : "unexpected tensor \"mask\"");
  }
  if (!masked) return absl::OkStatus();
  if (m->second.dtype != DType::kU8 || m->second.shape != std::vector<int64_t>{n}) {
    return absl::InvalidArgumentError(absl::StrCat("\"mask\" must be U8(", n, ")"));
  }
  mask = m->second.data;
  got.erase(m);
  return absl::OkStatus();
}

template <typename T, typename C>
TensorMap PutSpanResult(const C& c, const SpanPlan& plan, const SpanTask& task,
                        const SpanResultOf<T, C>& r, bool partials) {
  TensorMap out;
  using Outputs = SpanOutputs<T, typename Family<C>::template Layer<T>>;
  Outputs& values = const_cast<Outputs&>(r.out);  // read only, as above
  for (const Slot<T>& slot : OutputSlots(c, plan, task, values, partials))
    out.emplace(slot.name, HostTensor::From<T>(*slot.values, slot.shape, DTypeOf<T>()));
  if (task.phase == SpanPhase::kForward && task.layer + 1 == plan.layers()) {
    out.emplace(kLossSum, Scalar(r.out.loss_sum, DType::kF64));
    out.emplace(kCorrect, Scalar(r.out.correct, DType::kI64));
  }
  out.emplace(kComputeSeconds, Scalar(r.compute_seconds, DType::kF64));
  out.emplace(kRebuildSeconds, Scalar(r.rebuild_seconds, DType::kF64));
  out.emplace(kDeviceTraffic, TrafficTensor(r.device));
  return out;
}

template <typename T, typename C>
absl::StatusOr<SpanResultOf<T, C>> TakeSpanResult(const C& c, const SpanPlan& plan,
                                                  const SpanTask& task, TensorMap& got,
                                                  bool partials) {
  SpanResultOf<T, C> r;
  for (const Slot<T>& slot : OutputSlots(c, plan, task, r.out, partials)) {
    if (absl::Status s = Take(got, slot.name, slot.shape, DTypeOf<T>(), *slot.values); !s.ok())
      return s;
  }
  if (task.phase == SpanPhase::kForward && task.layer + 1 == plan.layers()) {
    absl::StatusOr<double> loss = TakeScalar<double>(got, kLossSum, DType::kF64);
    if (!loss.ok()) return loss.status();
    absl::StatusOr<int64_t> correct = TakeScalar<int64_t>(got, kCorrect, DType::kI64);
    if (!correct.ok()) return correct.status();
    r.out.loss_sum = *loss, r.out.correct = *correct;
  }
  absl::StatusOr<double> compute = TakeScalar<double>(got, kComputeSeconds, DType::kF64);
  if (!compute.ok()) return compute.status();
  absl::StatusOr<double> rebuild = TakeScalar<double>(got, kRebuildSeconds, DType::kF64);
  if (!rebuild.ok()) return rebuild.status();
  r.compute_seconds = *compute, r.rebuild_seconds = *rebuild;
  absl::StatusOr<DeviceTraffic> traffic = TakeTraffic(got);
  if (!traffic.ok()) return traffic.status();
  r.device = *traffic;
  if (!got.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("result has an unexpected tensor \"", got.begin()->first, "\""));
  }
  return r;
}

template <typename C>
bool HasPartials(const C& c, const SpanPlan& plan, const SpanTask& task, const TensorMap& got) {
  SpanOutputs<float, typename Family<C>::template Layer<float>> probe;
  const std::vector<Slot<float>> all = OutputSlots(c, plan, task, probe, true);
  const std::vector<Slot<float>> without = OutputSlots(c, plan, task, probe, false);
  for (const Slot<float>& slot : all) {
    const bool partial = std::none_of(without.begin(), without.end(),
                                      [&](const Slot<float>& w) { return w.name == slot.name; });
    if (partial && got.count(slot.name) > 0) return true;
  }
  return false;
}

template <typename C>
uint64_t SpanResultBytes(const C& c, const SpanPlan& plan, const SpanTask& task,
                         int64_t value_bytes) {
  SpanOutputs<double, typename Family<C>::template Layer<double>> probe;
  uint64_t n = 64;  // the scalars
  for (const Slot<double>& slot : OutputSlots(c, plan, task, probe))
    n += static_cast<uint64_t>(ShapeNumel(slot.shape)) * static_cast<uint64_t>(value_bytes);
  return n;
}

template <typename T, typename Layer>
std::string FirstNonFinite(const SpanOutputs<T, Layer>& o) {
  for (auto [name, v] : {std::pair{"sigma", &o.sigma}, std::pair{"h_end", &o.h_end},
                         std::pair{"halo_next", &o.halo_next}, std::pair{"m", &o.m},
                         std::pair{"du_halo_prev", &o.du_halo_prev},
                         std::pair{"embed", &o.embed}, std::pair{"norm_f", &o.norm_f}})
    if (std::string bad = Scan(name, *v); !bad.empty()) return bad;
  for (const auto& slot : FamilyOf<Layer>::template LayerSlots<T>())
    if (std::string bad = Scan(slot.suffix, o.grad.*slot.member); !bad.empty()) return bad;
  if (!std::isfinite(o.loss_sum)) return absl::StrCat("loss_sum = ", o.loss_sum);
  if (o.partials_nonfinite != T(0)) return "a partial left on the device (embed or grad)";
  return "";
}

#define ADJSH_SPAN_TENSORS(T, C)                                                               \
  template void PutSpanInputs<T, C>(const C&, const SpanPlan&, const SpanTask&,                \
                                    const SpanInputs<T>&, const std::string&, TensorMap&);     \
  template absl::StatusOr<SpanInputs<T>> TakeSpanInputs<T, C>(                                 \
      const C&, const SpanPlan&, const SpanTask&, const std::string&, TensorMap&);             \
  template TensorMap PutSpanResult<T, C>(const C&, const SpanPlan&, const SpanTask&,           \
                                         const SpanResultOf<T, C>&, bool);                     \
  template absl::StatusOr<SpanResultOf<T, C>> TakeSpanResult<T, C>(                            \
      const C&, const SpanPlan&, const SpanTask&, TensorMap&, bool);                           \
  template std::string FirstNonFinite<T>(const SpanOutputs<T, typename Family<C>::template Layer<T>>&);
ADJSH_SPAN_TENSORS(float, MambaConfig)
ADJSH_SPAN_TENSORS(double, MambaConfig)
ADJSH_SPAN_TENSORS(float, Mamba2Config)
ADJSH_SPAN_TENSORS(double, Mamba2Config)
#undef ADJSH_SPAN_TENSORS
template absl::Status TakeSpanStart<MambaConfig>(const MambaConfig&, const SpanPlan&, int64_t,
                                                 bool, TensorMap&, std::vector<uint32_t>&,
                                                 std::vector<uint8_t>&);
template absl::Status TakeSpanStart<Mamba2Config>(const Mamba2Config&, const SpanPlan&, int64_t,
                                                  bool, TensorMap&, std::vector<uint32_t>&,
                                                  std::vector<uint8_t>&);
template bool HasPartials<MambaConfig>(const MambaConfig&, const SpanPlan&, const SpanTask&,
                                       const TensorMap&);
template bool HasPartials<Mamba2Config>(const Mamba2Config&, const SpanPlan&, const SpanTask&,
                                        const TensorMap&);
template uint64_t SpanResultBytes<MambaConfig>(const MambaConfig&, const SpanPlan&,
                                               const SpanTask&, int64_t);
template uint64_t SpanResultBytes<Mamba2Config>(const Mamba2Config&, const SpanPlan&,
                                                const SpanTask&, int64_t);

}  // namespace adjsh
