// What the span ledger (engine/span_ledger.h) needs of a model type, so that one ledger combines
// the spans of a Mamba-1 and of a Mamba-2 step. Both carry a state of (Di, N) per layer and span
// across span boundaries, decayed by exp(A Sigma) per (channel, state) with Sigma (Di) a span's
// dt sums: for Mamba-1 A is (Di, N) and dt per channel; for Mamba-2 (Di = H P, the state
// (H, P, N)) A and dt are per head, so A repeats A_h over the head's P N entries and a span
// sends Sigma with dt_h's sum over the span repeated over the head's P channels
// (docs/MATH.md "Mamba-2", spans). Both decay exactly as the scan, exp(dt A) per token, whose
// product over a span is exp(A Sigma).
#ifndef ADJSH_ENGINE_SPAN_FAMILY_H_
#define ADJSH_ENGINE_SPAN_FAMILY_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/check.h"
#include "common/model.h"
#include "engine/decay.h"
#include "common/mamba2_model.h"
#include "engine/reduce_groups.h"

namespace adjsh {

template <template <typename> class P>
struct SpanFamily;

template <>
struct SpanFamily<ModelParams> {
  template <typename T>
  using Layer = LayerParams<T>;
  static int64_t StateSize(const MambaConfig& c) { return c.inner() * c.state_size; }  // Di N
  template <typename T>
  static std::vector<T> Rates(const ModelParams<T>& p) {  // K x (Di, N)
    return DecayRates(p);
  }
  template <typename T>
  static void Add(Layer<T>& a, const Layer<T>& b) {
    AddInto(a, b);
  }
  template <typename T>
  static int64_t LayerNumel(const MambaConfig& c) {
    int64_t n = 0;
    for (const auto& slot : LayerParamSlots<T>()) n += ShapeNumel(slot.shape(c));
    return n;
  }
  template <typename T>
  static Layer<T> FromGroup(GroupValue<T>&& v) {
    return LayerFromGroup(std::move(v));
  }
};

template <>
struct SpanFamily<Mamba2Params> {
  template <typename T>
  using Layer = Mamba2Layer<T>;
  static int64_t StateSize(const Mamba2Config& c) { return c.inner() * c.state_size; }
  template <typename T>
  static std::vector<T> Rates(const Mamba2Params<T>& p) {  // K x (H P, N): A_h repeated
    const int64_t PN = p.config.head_dim * p.config.state_size, H = p.config.num_heads;
    std::vector<T> A(p.layers.size() * H * PN);
    for (size_t k = 0; k < p.layers.size(); ++k)
      for (int64_t h = 0; h < H; ++h) {
        const T a = -std::exp(p.layers[k].A_log[h]);
        for (int64_t q = 0; q < PN; ++q) A[(k * H + h) * PN + q] = a;
      }
    return A;
  }
  template <typename T>
  static void Add(Layer<T>& a, const Layer<T>& b) {  // a += b, slot by slot
    for (const Mamba2LayerSlot<T>& slot : Mamba2LayerSlots<T>()) {
      std::vector<T>& x = a.*slot.member;
      const std::vector<T>& y = b.*slot.member;
      for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    }
  }
  template <typename T>
  static int64_t LayerNumel(const Mamba2Config& c) {
    int64_t n = 0;
    for (const Mamba2LayerSlot<T>& slot : Mamba2LayerSlots<T>()) n += ShapeNumel(slot.shape(c));
    return n;
  }
  template <typename T>
  static Layer<T> FromGroup(GroupValue<T>&& v) {  // the tensors in Mamba2LayerSlots order
    ADJSH_CHECK(v.size() == Mamba2LayerSlots<T>().size(),
                "a Mamba-2 layer group of the wrong size");
    Layer<T> l;
    size_t i = 0;
    for (const Mamba2LayerSlot<T>& slot : Mamba2LayerSlots<T>()) l.*slot.member = std::move(v[i++]);
    return l;
  }
};

// A config's layer struct and the list of its tensors (HF names within a layer, shapes), for
// the wire form of span tasks (engine/span_tensors.h), which takes the config alone.
template <typename C, typename T>
struct LayerOf;
template <typename T>
struct LayerOf<MambaConfig, T> {
  using type = LayerParams<T>;
};
template <typename T>
struct LayerOf<Mamba2Config, T> {
  using type = Mamba2Layer<T>;
};
template <typename T>
const std::vector<LayerParamSlot<T>>& LayerSlotsOf(const LayerParams<T>*) {
  return LayerParamSlots<T>();
}
template <typename T>
const std::vector<Mamba2LayerSlot<T>>& LayerSlotsOf(const Mamba2Layer<T>*) {
  return Mamba2LayerSlots<T>();
}

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPAN_FAMILY_H_
