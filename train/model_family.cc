#include "train/model_family.h"

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/mamba2_config.h"
#include "common/python_json.h"
#include "engine/capabilities.h"
#include "engine/mamba2_eval.h"

namespace adjsh::train {

using Mamba1 = ModelFamily<ModelParams<float>>;
using Mamba2 = ModelFamily<Mamba2Params<float>>;

std::string Mamba1::Shape(const MambaConfig& config) { return ShapeJson(config); }

absl::Status Mamba1::Save(const std::string& dir, const Params& params, DType dtype) {
  return SaveModelDir(dir, params, dtype);
}

absl::StatusOr<Mamba1::Params> Mamba1::Load(const std::string& dir) {
  return LoadModelDir<float>(dir);
}

absl::StatusOr<Mamba1::Grad> Mamba1::Gradient(const Params& params, const GradPiece& piece) {
  return ComputeGradient<float>(params, piece.tokens, piece.options);
}

absl::StatusOr<EvalResult> Mamba1::Evaluate(const Params& params, const TokenData& tokens,
                                            const EvalOptions& options) {
  return adjsh::Evaluate<float>(params, tokens, options);
}

std::string Mamba2::Shape(const Mamba2Config& config) {
  Mamba2Config shape = config;
  shape.extra.clear();
  // Strict JSON (the trainer parses it into its definition): time_step_limit's Infinity as
  // common/python_json.h's marker string.
  return PythonJsonToStrict(Mamba2ConfigToJson(shape));
}

absl::Status Mamba2::Save(const std::string& dir, const Params& params, DType dtype) {
  return SaveMamba2ModelDir(dir, params, dtype);
}

absl::StatusOr<Mamba2::Params> Mamba2::Load(const std::string& dir) {
  return LoadMamba2ModelDir<float>(dir);
}

absl::StatusOr<Mamba2::Grad> Mamba2::Gradient(const Params& params, const GradPiece& piece) {
  if (absl::Status s = Supports({.model = ModelType::kMamba2, .options = piece.options});
      !s.ok())
    return s;
  return Mamba2Gradient<float>(params, piece.tokens, Mamba2GradOptionsFrom(piece.options));
}

absl::StatusOr<EvalResult> Mamba2::Evaluate(const Params& params, const TokenData& tokens,
                                            const EvalOptions& options) {
  return Mamba2Evaluate<float>(params, tokens, options);
}

}  // namespace adjsh::train
