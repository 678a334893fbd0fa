#include "engine/adjoint_engine.h"

#include <unistd.h>

#include "absl/strings/str_format.h"
#include "engine/gradient_step.h"
#include "kernels/cpu/blas.h"

namespace adjsh {

template <typename T>
absl::StatusOr<GradResult<T>> ComputeGradient(const ModelParams<T>& params,
                                              std::span<const uint32_t> tokens,
                                              const GradOptions& options) {
  if (tokens.size() < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the sequence has %d token(s): the next-token loss needs at least 2", tokens.size()));
  }
  if (options.chunk < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("chunk must be >= 1, got %d", options.chunk));
  }
  if (options.window < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("window must be >= 1 (or 0 for exact), got %d", options.window));
  }
  if (!options.spill_dir.empty() && access(options.spill_dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "spill directory %s does not exist or is not writable", options.spill_dir));
  }
  const int64_t V = params.config.vocab_size;
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (int64_t{tokens[t]} >= V) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token %d at position %d is outside the vocabulary (vocab_size %d)", tokens[t], t, V));
    }
  }
  cpu::InitBlasSingleThreaded();
  return GradientStep<T>(params, tokens, options).Run();
}

template absl::StatusOr<GradResult<float>> ComputeGradient<float>(const ModelParams<float>&,
                                                                  std::span<const uint32_t>,
                                                                  const GradOptions&);
template absl::StatusOr<GradResult<double>> ComputeGradient<double>(const ModelParams<double>&,
                                                                    std::span<const uint32_t>,
                                                                    const GradOptions&);

}  // namespace adjsh
