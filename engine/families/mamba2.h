// Mamba-2's family (engine/families/family.h): Mamba2Config, Mamba2Params (common/
// mamba2_model.h) and its layer op table on a backend (kernels/mamba2_chunk_ops.h). Its state is
// (H, P, N) per layer, Di = H P: A and dt are per head, so the ledger's rates repeat A_h over the
// head's P N entries, and a span's Sigma repeats dt_h's sum over the head's P channels
// (docs/MATH.md "Mamba-2", spans). Both types decay exactly as the scan, exp(dt A) per token,
// whose product over a span is exp(A Sigma).
#ifndef ADJSH_ENGINE_FAMILIES_MAMBA2_H_
#define ADJSH_ENGINE_FAMILIES_MAMBA2_H_

#include <cmath>

#include "common/mamba2_config.h"
#include "common/mamba2_model.h"
#include "engine/families/family.h"
#include "kernels/mamba2_chunk_ops.h"

namespace adjsh {

template <>
struct Family<Mamba2Config> : FamilyBase<Family<Mamba2Config>> {
  static constexpr ModelType kType = ModelType::kMamba2;
  using Config = Mamba2Config;
  template <typename T>
  using Params = Mamba2Params<T>;
  template <typename T>
  using Layer = Mamba2Layer<T>;
  template <typename T>
  using Model = LayerModel<Mamba2Params<T>>;
  template <typename T>
  using SpanMath = adjsh::SpanMath<Mamba2Params<T>>;
  template <typename T>
  using GradOf = GradResult<T, Mamba2Params>;  // a gradient and its loss (engine/grad_result.h)
  using Grad = GradOf<float>;
  static constexpr const char* kLabel = "Mamba-2";  // in messages

  template <typename T>
  static const std::vector<Mamba2LayerSlot<T>>& LayerSlots() {
    return Mamba2LayerSlots<T>();
  }
  template <typename T>
  static std::vector<T> Rates(const Params<T>& p) {  // K x (H P, N): A_h repeated
    const int64_t PN = p.config.head_dim * p.config.state_size, H = p.config.num_heads;
    std::vector<T> A(p.layers.size() * H * PN);
    for (size_t k = 0; k < p.layers.size(); ++k)
      for (int64_t h = 0; h < H; ++h) {
        const T a = -std::exp(p.layers[k].A_log[h]);
        for (int64_t q = 0; q < PN; ++q) A[(k * H + h) * PN + q] = a;
      }
    return A;
  }

  static absl::StatusOr<Config> ParseConfig(std::string_view text) {
    return ParseMamba2ConfigJson(text);
  }
  static std::string ConfigJson(const Config& c) { return Mamba2ConfigToJson(c); }
  static uint64_t ParamBytes(const Config& c) { return Mamba2ParamBytesF32(c); }
  // const_cast: the slot walk takes a mutable struct, and only reads it here.
  template <typename T>
  static TensorMap ToTensors(const Params<T>& p, DType dtype) {
    return Mamba2ParamsToTensors<T>(const_cast<Params<T>&>(p), dtype);
  }
  static absl::StatusOr<Params<float>> FromTensors(const Config& c, const TensorMap& named) {
    return Mamba2ParamsFromTensors<float>(c, named);
  }
  // A Mamba-2 layer (f32 storage on a GPU), the head, and with a loss mask its greedy count.
  static absl::Status CheckBackend(const Backend<float>& backend, const Config&, bool masked) {
    return CheckMamba2Backend(backend, masked);
  }

  // Strict JSON, as Mamba-1's (a bare Infinity as common/python_json.h's marker string).
  static std::string Shape(const Config& config);
  static absl::Status Save(const std::string& dir, const Params<float>& params, DType dtype);
  template <typename T>
  static absl::StatusOr<Params<T>> Load(const std::string& dir) {
    return LoadMamba2ModelDir<T>(dir);
  }
  // In-process, on the options' device (engine/mamba2_grad.h); what it cannot take is refused
  // by engine/capabilities.h's table.
  template <typename T>
  static absl::StatusOr<GradOf<T>> Gradient(const Params<T>& params, const GradPiece& piece);
};

template <>
struct ParamsFamily<Mamba2Params> {
  using type = Family<Mamba2Config>;
};
template <typename T>
struct FamilyOfStruct<Mamba2Layer<T>> {
  using type = Family<Mamba2Config>;
};
template <typename T>
struct FamilyOfStruct<Mamba2Params<T>> {
  using type = Family<Mamba2Config>;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_FAMILIES_MAMBA2_H_
