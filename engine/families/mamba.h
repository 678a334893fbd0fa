// Mamba-1's family (engine/families/family.h): MambaConfig, ModelParams (common/model.h) and its
// layer op table on a backend (kernels/mamba_chunk_ops.h).
#ifndef ADJSH_ENGINE_FAMILIES_MAMBA_H_
#define ADJSH_ENGINE_FAMILIES_MAMBA_H_

#include "common/config.h"
#include "common/model.h"
#include "engine/families/family.h"
#include "kernels/decay.h"
#include "kernels/mamba_chunk_ops.h"

namespace adjsh {

template <>
struct Family<MambaConfig> : FamilyBase<Family<MambaConfig>> {
  static constexpr ModelType kType = ModelType::kMamba;
  using Config = MambaConfig;
  template <typename T>
  using Params = ModelParams<T>;
  template <typename T>
  using Layer = LayerParams<T>;
  template <typename T>
  using Model = LayerModel<ModelParams<T>>;
  template <typename T>
  using SpanMath = adjsh::SpanMath<ModelParams<T>>;
  template <typename T>
  using GradOf = GradResult<T, ModelParams>;  // a gradient and its loss (engine/grad_result.h)
  using Grad = GradOf<float>;
  static constexpr const char* kLabel = "Mamba-1";  // in messages

  template <typename T>
  static const std::vector<LayerParamSlot<T>>& LayerSlots() {
    return LayerParamSlots<T>();
  }
  template <typename T>
  static std::vector<T> Rates(const Params<T>& p) {  // K x (Di, N)
    return DecayRates(p);
  }

  static absl::StatusOr<Config> ParseConfig(std::string_view text) {
    return ParseConfigJson(text);
  }
  static std::string ConfigJson(const Config& c) { return ConfigToJson(c); }
  static uint64_t ParamBytes(const Config& c) { return ParamBytesF32(c); }
  template <typename T>
  static TensorMap ToTensors(const Params<T>& p, DType dtype) {
    return ParamsToTensors<T>(p, dtype);
  }
  static absl::StatusOr<Params<float>> FromTensors(const Config& c, const TensorMap& named) {
    return ParamsFromTensors<float>(c, named);
  }
  // The shape the backend takes, and with a loss mask the head's greedy count.
  static absl::Status CheckBackend(const Backend<float>& backend, const Config& c, bool masked) {
    if (absl::Status s = backend.CheckConfig(c); !s.ok()) return s;
    return masked ? backend.Require(Op::kHeadAccuracy) : absl::OkStatus();
  }

  // The config without its extra keys, as JSON: a resume must match it.
  static std::string Shape(const Config& config);
  static absl::Status Save(const std::string& dir, const Params<float>& params, DType dtype);
  template <typename T>
  static absl::StatusOr<Params<T>> Load(const std::string& dir) {
    return LoadModelDir<T>(dir);
  }
  // In-process (engine/adjoint_engine.h ComputeGradient), any option of the capability table.
  template <typename T>
  static absl::StatusOr<GradOf<T>> Gradient(const Params<T>& params, const GradPiece& piece);
};

template <>
struct ParamsFamily<ModelParams> {
  using type = Family<MambaConfig>;
};
template <typename T>
struct FamilyOfStruct<LayerParams<T>> {
  using type = Family<MambaConfig>;
};
template <typename T>
struct FamilyOfStruct<ModelParams<T>> {
  using type = Family<MambaConfig>;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_FAMILIES_MAMBA_H_
