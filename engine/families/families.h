// Every model type's family (engine/families/family.h says what one gives), and the one list
// of them: a new model type is one more header here and one more alternative in EachFamily.
#ifndef ADJSH_ENGINE_FAMILIES_FAMILIES_H_
#define ADJSH_ENGINE_FAMILIES_FAMILIES_H_

#include <string>
#include <string_view>
#include <variant>

#include "engine/families/family.h"
#include "engine/families/mamba.h"
#include "engine/families/mamba2.h"

namespace adjsh {

// One X<F> of some model type F, for what holds one model type's state and is visited
// (std::visit) where it is used: the worker's jobs (worker/span_store.h), the coordinator's
// step (coordinator/task_service.h) and a task's checked result (coordinator/
// span_scheduler.h).
template <template <typename> class X>
using EachFamily = std::variant<X<Family<MambaConfig>>, X<Family<Mamba2Config>>>;

// A family's float parameters, read-only (the coordinator's step).
template <typename F>
using ParamsOf = const typename F::template Params<float>*;

// f(Family<Config>{}) for the family of `type`: what every model type's code path is chosen by
// (a command's model folder, a job's model). Each branch must return the same type.
template <typename Fn>
decltype(auto) VisitFamily(ModelType type, Fn&& f) {
  if (type == ModelType::kMamba2) return f(Family<Mamba2Config>{});
  return f(Family<MambaConfig>{});
}

// The model type a config.json's model_type names: "mamba2" is Mamba-2's; anything else goes to
// Mamba-1's reader, which names what it refuses.
inline ModelType ModelTypeOfName(std::string_view model_type) {
  return model_type == "mamba2" ? ModelType::kMamba2 : ModelType::kMamba;
}
// The model type a model folder's config.json names (common/mamba2_config.h ModelTypeOfDir).
inline ModelType ModelTypeOfFolder(const std::string& dir) {
  return ModelTypeOfName(ModelTypeOfDir(dir));
}

}  // namespace adjsh

#endif  // ADJSH_ENGINE_FAMILIES_FAMILIES_H_
