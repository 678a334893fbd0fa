// Mamba-2's exact gradient (engine/mamba2_grad.h): the inputs checked, then the span schedule
// of engine/span_step.h on Mamba2SpanWork (engine/span_work.h over engine/span_math.h), the tasks a coordinator's
// workers run.
#include "engine/mamba2_grad.h"

#include "absl/strings/str_cat.h"
#include "common/tokens.h"
#include "engine/span_step.h"

namespace adjsh {

Mamba2GradOptions Mamba2GradOptionsFrom(const GradOptions& options) {
  Mamba2GradOptions o;
  o.chunk = options.chunk;
  o.spans = options.spans;
  o.threads = options.threads;
  o.loss_mask = options.loss_mask;
  o.storage = options.storage;
  o.spill_dir = options.spill_dir;
  o.device = options.device;
  o.progress = options.progress;
  return o;
}

template <typename T>
absl::StatusOr<Mamba2GradResult<T>> Mamba2Gradient(const Mamba2Params<T>& params,
                                                   std::span<const uint32_t> tokens,
                                                   const Mamba2GradOptions& options) {
  const Mamba2Config& cfg = params.config;
  const int64_t T_ = static_cast<int64_t>(tokens.size());
  const std::span<const uint8_t> loss_mask = options.loss_mask;
  if (T_ < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a gradient needs at least 2 tokens (one next-token target), got ", T_));
  }
  if (options.chunk < 1)
    return absl::InvalidArgumentError(absl::StrCat("chunk must be >= 1, got ", options.chunk));
  if (absl::Status s = CheckTokensInVocab(tokens, cfg.vocab_size); !s.ok()) return s;
  if (absl::Status s = CheckLossMask(loss_mask, T_); !s.ok()) return s;
  return RunMamba2SpanStep(params, tokens, options);
}

template absl::StatusOr<Mamba2GradResult<float>> Mamba2Gradient<float>(
    const Mamba2Params<float>&, std::span<const uint32_t>, const Mamba2GradOptions&);
template absl::StatusOr<Mamba2GradResult<double>> Mamba2Gradient<double>(
    const Mamba2Params<double>&, std::span<const uint32_t>, const Mamba2GradOptions&);

}  // namespace adjsh
