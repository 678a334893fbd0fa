// The span schedule in-process (engine/span_plan.h): one SpanWork per span, the span tasks run
// on the step's threads in dependency order, each result applied to one SpanLedger under a
// lock. The same tasks on the same inputs, applied by the same ledger, as a coordinator and its
// workers run them: the result is bitwise the same for any thread or worker count.
#ifndef ADJSH_ENGINE_SPAN_STEP_H_
#define ADJSH_ENGINE_SPAN_STEP_H_

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "common/model.h"
#include "engine/grad_options.h"
#include "engine/grad_result.h"
#include "engine/mamba2_grad.h"

namespace adjsh {

// options.schedule must be kSpans, window 0 and the cotangent exact; inputs validated by the
// caller (ComputeGradient).
template <typename T>
absl::StatusOr<GradResult<T>> RunSpanStep(const ModelParams<T>& params,
                                          std::span<const uint32_t> tokens,
                                          const GradOptions& options);

// The same schedule for a Mamba-2 model (engine/span_math.h), which Mamba2Gradient runs
// (engine/mamba2_grad.h): the step's spans options.spans, on options.threads threads. Inputs
// validated by the caller.
template <typename T>
absl::StatusOr<Mamba2GradResult<T>> RunMamba2SpanStep(const Mamba2Params<T>& params,
                                                      std::span<const uint32_t> tokens,
                                                      const Mamba2GradOptions& options);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPAN_STEP_H_
