#include "engine/families/mamba2.h"

#include "common/python_json.h"
#include "engine/evaluate.h"
#include "engine/mamba2_grad.h"

namespace adjsh {

using Mamba2 = Family<Mamba2Config>;

std::string Mamba2::Shape(const Mamba2Config& config) {
  Mamba2Config shape = config;
  shape.extra.clear();
  // Strict JSON (the trainer parses it into its definition): time_step_limit's Infinity as
  // common/python_json.h's marker string.
  return PythonJsonToStrict(Mamba2ConfigToJson(shape));
}

absl::Status Mamba2::Save(const std::string& dir, const Params<float>& params, DType dtype) {
  return SaveMamba2ModelDir(dir, params, dtype);
}

absl::StatusOr<Mamba2::Grad> Mamba2::Gradient(const Params<float>& params,
                                              const GradPiece& piece) {
  if (absl::Status s = Supports({.model = kType, .options = piece.options}); !s.ok()) return s;
  return Mamba2Gradient<float>(params, piece.tokens, Mamba2GradOptionsFrom(piece.options));
}

}  // namespace adjsh
