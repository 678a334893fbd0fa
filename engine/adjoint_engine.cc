#include "engine/adjoint_engine.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/capabilities.h"
#include "engine/gradient_step.h"
#include "engine/span_plan.h"
#include "engine/span_step.h"
#include "common/tokens.h"

namespace adjsh {

template <typename C>
absl::Status ValidateGradientInputs(const C& config, std::span<const uint32_t> tokens,
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
  if (absl::Status s = CheckLossMask(options.loss_mask, static_cast<int64_t>(tokens.size()));
      !s.ok())
    return s;
  if (!options.spill_dir.empty() && access(options.spill_dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "spill directory %s does not exist or is not writable", options.spill_dir));
  }
  if (absl::Status s = CheckTokensInVocab(tokens, config.vocab_size); !s.ok()) return s;
  if (options.spans < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("spans must be >= 1 (or 0 for the default), got %d", options.spans));
  }
  if (options.schedule == Schedule::kSpans && options.window == 0 &&
      options.cotangent == Cotangent::kExact) {
    absl::StatusOr<SpanPlan> plan =
        SpanPlan::Make(static_cast<int64_t>(tokens.size()), options.chunk, options.spans,
                       config.num_hidden_layers, config.conv_kernel);
    if (!plan.ok()) return plan.status();
  }
  return CheckDevice<float>(config, options);
}

template absl::Status ValidateGradientInputs<MambaConfig>(const MambaConfig&,
                                                          std::span<const uint32_t>,
                                                          const GradOptions&);
template absl::Status ValidateGradientInputs<Mamba2Config>(const Mamba2Config&,
                                                           std::span<const uint32_t>,
                                                           const GradOptions&);

template <typename T>
absl::StatusOr<GradResult<T>> ComputeGradient(const ModelParams<T>& params,
                                              std::span<const uint32_t> tokens,
                                              const GradOptions& options) {
  // The device for T first: f64 on a GPU is refused as that, whatever else is wrong.
  if (absl::Status s = CheckDevice<T>(params.config, options); !s.ok()) return s;
  RunRequest request{.model = ModelType::kMamba, .options = options};
  request.f64 = std::is_same_v<T, double>;
  if (absl::Status s = Supports(request); !s.ok()) return s;
  if (absl::Status s = ValidateGradientInputs(params.config, tokens, options); !s.ok()) return s;
  if (options.schedule == Schedule::kSpans && options.window == 0 &&
      options.cotangent == Cotangent::kExact) {
    return RunSpanStep<T>(params, tokens, options);
  }
  return GradientStep<T>(params, tokens, options).Run();
}

template absl::StatusOr<GradResult<float>> ComputeGradient<float>(const ModelParams<float>&,
                                                                  std::span<const uint32_t>,
                                                                  const GradOptions&);
template absl::StatusOr<GradResult<double>> ComputeGradient<double>(const ModelParams<double>&,
                                                                    std::span<const uint32_t>,
                                                                    const GradOptions&);

}  // namespace adjsh
