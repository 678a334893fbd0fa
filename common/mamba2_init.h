// A new Mamba-2 model's parameters: mamba_ssm's Mamba2 initialisation with transformers'
// Mamba2PreTrainedModel weight init, made reproducible as Mamba-1's (common/init_rng.h: every
// tensor its own stream, seeded from (seed, HF name)).
//   embeddings, lm_head when untied, in_proj           normal(0, 0.02)
//   out_proj (D, Di)                                   normal(0, 0.02 / sqrt(K))  (residual)
//   conv1d weight (Cc, 1, W) and bias (Cc)             uniform(+-1/sqrt(W))  (PyTorch Conv1d
//                                                      default: fan_in = W per channel)
//   dt_bias (H)        softplus^-1(dt), dt = exp(u (ln 0.1 - ln 0.001) + ln 0.001) >= 1e-4
//   A_log (H)          ln(a), a uniform in [1, 16)
//   D (H), norms       1
#ifndef ADJSH_COMMON_MAMBA2_INIT_H_
#define ADJSH_COMMON_MAMBA2_INIT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/mamba2_model.h"

namespace adjsh {

// INVALID_ARGUMENT when the config does not validate (ValidateMamba2Config).
template <typename T>
absl::StatusOr<Mamba2Params<T>> InitMamba2Params(const Mamba2Config& config, uint64_t seed);

}  // namespace adjsh

#endif  // ADJSH_COMMON_MAMBA2_INIT_H_
