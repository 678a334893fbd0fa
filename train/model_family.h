// What the trainer, its optimizer state and its checkpoints need of a model type, for the two
// parameter structs: Mamba-1's ModelParams<float> (common/model.h) and Mamba-2's
// Mamba2Params<float> (common/mamba2_model.h). Each family gives its config type, the result
// type of its gradient, the shape a resume must match, its model folder's reader and writer,
// its in-process gradient and evaluation; what it can run is engine/capabilities.h's (kType).
#ifndef ADJSH_TRAIN_MODEL_FAMILY_H_
#define ADJSH_TRAIN_MODEL_FAMILY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model.h"
#include "common/token_data.h"
#include "engine/adjoint_engine.h"
#include "engine/capabilities.h"
#include "engine/evaluate.h"
#include "engine/mamba2_grad.h"
#include "common/mamba2_model.h"
#include "engine/segments.h"

namespace adjsh::train {

template <typename P>
struct ModelFamily;

template <>
struct ModelFamily<ModelParams<float>> {
  using Params = ModelParams<float>;
  using Config = MambaConfig;
  using Grad = GradResult<float>;
  // The config without its extra keys, as JSON: a resume must match it.
  static std::string Shape(const Config& config);
  static absl::Status Save(const std::string& dir, const Params& params, DType dtype);
  static absl::StatusOr<Params> Load(const std::string& dir);
  static constexpr ModelType kType = ModelType::kMamba;
  static absl::StatusOr<Grad> Gradient(const Params& params, const GradPiece& piece);
  static absl::StatusOr<EvalResult> Evaluate(const Params& params, const TokenData& tokens,
                                             const EvalOptions& options);
};

template <>
struct ModelFamily<Mamba2Params<float>> {
  using Params = Mamba2Params<float>;
  using Config = Mamba2Config;
  using Grad = GradResult<float, Mamba2Params>;
  // Strict JSON, as Mamba-1's (a bare Infinity as common/python_json.h's marker string).
  static std::string Shape(const Config& config);
  static absl::Status Save(const std::string& dir, const Params& params, DType dtype);
  static absl::StatusOr<Params> Load(const std::string& dir);
  // What a Mamba-2 model's gradient takes is in engine/capabilities.h's table (a truncated
  // window and the top-of-stack cotangent are refused by name, UNIMPLEMENTED), what a device
  // lacks by its backend (kernels/mamba2_backend.h).
  static constexpr ModelType kType = ModelType::kMamba2;
  static absl::StatusOr<Grad> Gradient(const Params& params, const GradPiece& piece);
  static absl::StatusOr<EvalResult> Evaluate(const Params& params, const TokenData& tokens,
                                             const EvalOptions& options);
};

}  // namespace adjsh::train

#endif  // ADJSH_TRAIN_MODEL_FAMILY_H_
