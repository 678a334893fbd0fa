#include "engine/adjoint_engine.h"

#include <unistd.h>

#include "absl/strings/str_format.h"
#include "engine/gradient_step.h"
#include "common/tokens.h"

namespace adjsh {

absl::StatusOr<Storage> ParseStorage(std::string_view name) {
  if (name == "full") return Storage::kCompute;
  if (name == "bf16") return Storage::kBF16;
  return absl::InvalidArgumentError(
      absl::StrFormat("storage must be full or bf16, got '%s'", std::string(name)));
}

std::string_view StorageName(Storage storage) {
  return storage == Storage::kBF16 ? "bf16" : "full";
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
