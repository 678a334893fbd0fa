#include "engine/families/mamba.h"

#include "engine/adjoint_engine.h"

namespace adjsh {

using Mamba = Family<MambaConfig>;

std::string Mamba::Shape(const MambaConfig& config) { return ShapeJson(config); }

absl::Status Mamba::Save(const std::string& dir, const Params<float>& params, DType dtype) {
  return SaveModelDir(dir, params, dtype);
}

absl::StatusOr<Mamba::Grad> Mamba::Gradient(const Params<float>& params, const GradPiece& piece) {
  return ComputeGradient<float>(params, piece.tokens, piece.options);
}

}  // namespace adjsh
