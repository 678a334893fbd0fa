#include "engine/families/mamba2.h"

#include <type_traits>

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

template <typename T>
absl::StatusOr<GradResult<T, Mamba2Params>> Mamba2::Gradient(const Params<T>& params,
                                                             const GradPiece& piece) {
  if (absl::Status s = Supports({.model = kType, .f64 = std::is_same_v<T, double>,
                                 .options = piece.options});
      !s.ok())
    return s;
  return Mamba2Gradient<T>(params, piece.tokens, Mamba2GradOptionsFrom(piece.options));
}

template absl::StatusOr<GradResult<float, Mamba2Params>> Mamba2::Gradient(const Params<float>&,
                                                                          const GradPiece&);
template absl::StatusOr<GradResult<double, Mamba2Params>> Mamba2::Gradient(
    const Params<double>&, const GradPiece&);

}  // namespace adjsh
