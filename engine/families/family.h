// A model type's family: everything the schedules, the span ledger, the worker's task runner,
// the coordinator and the trainer take of a model type, behind one interface, so each of them
// is written once. One specialisation of Family<Config> per model type (engine/families/
// mamba.h, engine/families/mamba2.h), gathered by engine/families/families.h.
//
// Family<Config> gives, for its config type:
//   kType                       the capability table's model type (engine/capabilities.h)
//   Params<T>, Layer<T>         the parameters and one layer's (HF names, common/ or kernels/)
//   LayerSlots<T>()             a layer's tensors in order (name, shape): the wire form of a
//                               layer partial (engine/span_tensors.h, engine/reduce_groups.h)
//   Model<T>                    the parameters on a backend, per layer its op table
//                               (kernels/chunk_ops.h LayerModel; MakeModel)
//   SpanMath<T>                 the layer math of the owner of one span (engine/span_math.h),
//                               Work<T> (its tasks of engine/span_plan.h), and a task's
//                               Outputs<T> (FamilyBase)
//   StateSize, Rates<T>         the (Di N) state a span boundary carries, and per layer the decay
//                               rates A that combine it across spans (engine/span_ledger.h)
//   Add, LayerNumel<T>, FromGroup   a layer partial's sum, size and tree-group form (FamilyBase)
//   ParseConfig, ConfigJson, ParamBytes, ToTensors, FromTensors, CheckBackend, MakeModel
//                               the config and parameters on the wire, the worker's model
//                               of a version
//   Shape, Save, Load<T>        model folders, and what a resume must match
//   Gradient, Evaluate          the in-process gradient of one piece and the held-out loss
// Adding a model type: docs/ARCHITECTURE.md "Model types" lists what it takes, file by file.
#ifndef ADJSH_ENGINE_FAMILIES_FAMILY_H_
#define ADJSH_ENGINE_FAMILIES_FAMILY_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/check.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "common/token_data.h"
#include "engine/capabilities.h"
#include "engine/evaluate.h"
#include "engine/grad_result.h"
#include "engine/segments.h"
#include "engine/span_work.h"
#include "kernels/backend.h"

namespace adjsh {

template <typename Config>
struct Family;

// What every family computes alike from its LayerSlots<T>() (each slot: a member pointer into
// the layer struct and its shape for a config), inherited by each Family<Config> (CRTP).
template <typename Derived>
struct FamilyBase {
  // A task's outputs, and the span owner over the family's layer math (engine/span_work.h).
  // (D: Derived, named late, when Derived is complete.)
  template <typename T, typename D = Derived>
  using Outputs = SpanOutputs<T, typename D::template Layer<T>>;
  template <typename T, typename D = Derived>
  using Work = BasicSpanWork<typename D::template SpanMath<T>>;

  // a += b, slot by slot, element by element (the ledger's and the tree's sums).
  template <typename T, template <typename> class Layer>
  static void Add(Layer<T>& a, const Layer<T>& b) {
    for (const auto& slot : Derived::template LayerSlots<T>()) {
      std::vector<T>& x = a.*slot.member;
      const std::vector<T>& y = b.*slot.member;
      ADJSH_CHECK(x.size() == y.size(), slot.suffix);
      for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    }
  }
  // The state a span boundary carries per layer: (Di, N), Mamba-2's Di = H P.
  template <typename Config>
  static int64_t StateSize(const Config& c) {
    return c.inner() * c.state_size;
  }
  // The parameters on a backend (both must outlive the model); resident: the spans' rows on
  // its device where it has its own memory (a GPU worker's). The backend's errors.
  template <typename D = Derived>
  static absl::StatusOr<typename D::template Model<float>> MakeModel(
      const typename D::template Params<float>& p, Backend<float>& backend,
      RowPlace place = RowPlace::kHost) {
    return MakeLayerModel(p, backend, place);  // kernels/<type>_chunk_ops.h
  }
  // The held-out loss of a corpus (engine/evaluate.h, one evaluator for every type).
  template <typename D = Derived>
  static absl::StatusOr<EvalResult> Evaluate(const typename D::template Params<float>& p,
                                             const TokenData& tokens,
                                             const EvalOptions& options) {
    return adjsh::Evaluate<float>(p, tokens, options);
  }
  // Values in one layer's partial.
  template <typename T, typename Config>
  static int64_t LayerNumel(const Config& c) {
    int64_t n = 0;
    for (const auto& slot : Derived::template LayerSlots<T>()) n += ShapeNumel(slot.shape(c));
    return n;
  }
  // A layer from its tree group's value: the tensors in LayerSlots order.
  template <typename T>
  static auto FromGroup(std::vector<std::vector<T>>&& v) {
    typename Derived::template Layer<T> l;
    const auto& slots = Derived::template LayerSlots<T>();
    ADJSH_CHECK(v.size() == slots.size(), "a layer group has one tensor per layer parameter");
    for (size_t j = 0; j < slots.size(); ++j) l.*slots[j].member = std::move(v[j]);
    return l;
  }
};

// The family of a parameter struct template (ModelParams, Mamba2Params), for code templated on
// it (the span ledger, the trainer).
template <template <typename> class P>
struct ParamsFamily;
template <template <typename> class P>
using FamilyOfParams = typename ParamsFamily<P>::type;
// The family of one of its structs: a parameter struct (ModelParams<T>, Mamba2Params<T>) or a
// layer struct (LayerParams<T>, Mamba2Layer<T>), for code templated on it (the trainer and its
// checkpoints, engine/reduce_groups.h TakeLeaves).
template <typename Struct>
struct FamilyOfStruct;
template <typename Struct>
using FamilyOf = typename FamilyOfStruct<Struct>::type;

}  // namespace adjsh

#endif  // ADJSH_ENGINE_FAMILIES_FAMILY_H_
