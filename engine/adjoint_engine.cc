#include "engine/adjoint_engine.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "engine/gradient_step.h"
#include "common/tokens.h"

namespace adjsh {

absl::StatusOr<Cotangent> CotangentFromName(std::string_view name) {
  if (name == "exact") return Cotangent::kExact;
  if (name == "top-of-stack") return Cotangent::kTopOfStack;
  return absl::InvalidArgumentError(
      absl::StrFormat("--cotangent must be exact or top-of-stack, got '%s'", name));
}

absl::Status ValidateGradientInputs(const MambaConfig& config, std::span<const uint32_t> tokens,
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
  if (!options.loss_mask.empty()) {
    if (options.loss_mask.size() != tokens.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the loss mask has %d entries for %d tokens", options.loss_mask.size(), tokens.size()));
    }
    if (std::all_of(options.loss_mask.begin() + 1, options.loss_mask.end(),
                    [](uint8_t m) { return m == 0; })) {
      return absl::InvalidArgumentError("the loss mask counts no target (all zero after token 0)");
    }
  }
  if (!options.spill_dir.empty() && access(options.spill_dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "spill directory %s does not exist or is not writable", options.spill_dir));
  }
  return CheckTokensInVocab(tokens, config.vocab_size);
}

template <typename T>
absl::StatusOr<GradResult<T>> ComputeGradient(const ModelParams<T>& params,
                                              std::span<const uint32_t> tokens,
                                              const GradOptions& options) {
  if (absl::Status s = ValidateGradientInputs(params.config, tokens, options); !s.ok()) return s;
  return GradientStep<T>(params, tokens, options).Run();
}

template absl::StatusOr<GradResult<float>> ComputeGradient<float>(const ModelParams<float>&,
                                                                  std::span<const uint32_t>,
                                                                  const GradOptions&);
template absl::StatusOr<GradResult<double>> ComputeGradient<double>(const ModelParams<double>&,
                                                                    std::span<const uint32_t>,
                                                                    const GradOptions&);

}  // namespace adjsh
