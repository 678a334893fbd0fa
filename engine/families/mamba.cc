#include "engine/families/mamba.h"

#include "engine/adjoint_engine.h"

namespace adjsh {

using Mamba = Family<MambaConfig>;

std::string Mamba::Shape(const MambaConfig& config) { return ShapeJson(config); }

absl::Status Mamba::Save(const std::string& dir, const Params<float>& params, DType dtype) {
  return SaveModelDir(dir, params, dtype);
}

template <typename T>
absl::StatusOr<GradResult<T, ModelParams>> Mamba::Gradient(const Params<T>& params,
                                                           const GradPiece& piece) {
  return ComputeGradient<T>(params, piece.tokens, piece.options);
}

template absl::StatusOr<GradResult<float, ModelParams>> Mamba::Gradient(const Params<float>&,
                                                                        const GradPiece&);
template absl::StatusOr<GradResult<double, ModelParams>> Mamba::Gradient(const Params<double>&,
                                                                         const GradPiece&);

}  // namespace adjsh
