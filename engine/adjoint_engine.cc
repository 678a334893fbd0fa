#include "engine/adjoint_engine.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/gradient_step.h"
#include "engine/mamba2_backend.h"
#include "engine/span_plan.h"
#include "engine/span_step.h"
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

absl::StatusOr<Cotangent> CotangentFromName(std::string_view name) {
  if (name == "exact") return Cotangent::kExact;
  if (name == "top-of-stack") return Cotangent::kTopOfStack;
  return absl::InvalidArgumentError(
      absl::StrFormat("--cotangent must be exact or top-of-stack, got '%s'", name));
}

absl::StatusOr<Schedule> ScheduleFromName(std::string_view name) {
  if (name == "spans") return Schedule::kSpans;
  if (name == "wavefront") return Schedule::kWavefront;
  if (name == "two-pass") return Schedule::kTwoPass;
  return absl::InvalidArgumentError(absl::StrFormat(
      "--schedule must be spans, wavefront or two-pass, got '%s'", name));
}

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
  if (options.forward_only && (options.schedule != Schedule::kSpans || options.window != 0 ||
                               options.cotangent != Cotangent::kExact)) {
    return absl::InvalidArgumentError(
        "forward_only (the loss alone) runs the span schedule of the exact gradient only");
  }
  if (options.schedule == Schedule::kSpans && options.window == 0 &&
      options.cotangent == Cotangent::kExact) {
    absl::StatusOr<SpanPlan> plan =
        SpanPlan::Make(static_cast<int64_t>(tokens.size()), options.chunk, options.spans,
                       config.num_hidden_layers, config.conv_kernel);
    if (!plan.ok()) return plan.status();
  }
  if constexpr (std::is_same_v<C, MambaConfig>) {
    return CheckDevice<float>(config, options);
  } else {
    if (options.device.is_cpu() && !options.device.bf16_storage) return absl::OkStatus();
    absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(options.device);
    if (!backend.ok()) return backend.status();
    return CheckMamba2Backend(**backend, !options.loss_mask.empty());
  }
}

template absl::Status ValidateGradientInputs<MambaConfig>(const MambaConfig&,
                                                          std::span<const uint32_t>,
                                                          const GradOptions&);
template absl::Status ValidateGradientInputs<Mamba2Config>(const Mamba2Config&,
                                                           std::span<const uint32_t>,
                                                           const GradOptions&);

template <typename T>
absl::Status CheckDevice(const MambaConfig& config, const GradOptions& options) {
  if (options.device.is_cpu() && !options.device.bf16_storage) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend =
      MakeBackendFor<T>(options.device, config, {});  // the ops below, each named if lacking
  if (!backend.ok()) return backend.status();
  std::vector<Op> ops = {Op::kHead};
  // (push_back, not insert of a list: GCC 12 misreads the latter as an overflow.)
  const auto add = [&ops](std::initializer_list<Op> more) {
    for (Op op : more) ops.push_back(op);
  };
  if (!options.loss_mask.empty()) ops.push_back(Op::kHeadAccuracy);
  const bool spans = options.schedule == Schedule::kSpans && options.window == 0 &&
                     options.cotangent == Cotangent::kExact;
  if (options.window > 0) {
    add({Op::kForward, Op::kBackwardTruncated});
  } else if (spans) {
    add({Op::kForward, Op::kBackwardExact});
    if (options.spans != 1) add({Op::kLocalSummary, Op::kAdjointSummary});
  } else if (options.schedule != Schedule::kWavefront) {
    add({Op::kLocalSummary, Op::kForward, Op::kAdjointSummary,
                           Op::kBackwardExact});
  } else {
    add({Op::kForward, Op::kBackwardExact});
  }
  for (Op op : ops) {
    if (absl::Status s = (*backend)->Require(op); !s.ok()) {
      if (spans && (op == Op::kLocalSummary || op == Op::kAdjointSummary)) {
        return absl::UnimplementedError(absl::StrCat(
            s.message(), ": more than one span needs it (--spans 1 runs the step as one span)"));
      }
      return s;
    }
  }
  return absl::OkStatus();
}

template absl::Status CheckDevice<float>(const MambaConfig&, const GradOptions&);
template absl::Status CheckDevice<double>(const MambaConfig&, const GradOptions&);

template <typename T>
absl::StatusOr<GradResult<T>> ComputeGradient(const ModelParams<T>& params,
                                              std::span<const uint32_t> tokens,
                                              const GradOptions& options) {
  // The device for T first: f64 on a GPU is refused as that, whatever else is wrong.
  if (absl::Status s = CheckDevice<T>(params.config, options); !s.ok()) return s;
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
