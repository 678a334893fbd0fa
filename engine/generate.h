// Recurrent decoding: a prompt, then new tokens one at a time, each with constant work and
// memory (the model's streams, engine/model_stream.h: each layer's state and last W - 1 input
// rows), whatever the length so far. One decoder for both model types. The prompt is fed in chunks; each new token is one row
// through every layer and the head's logits for it, sampled with a temperature and top-k from
// a seeded generator, so the same seed gives the same tokens.
#ifndef ADJSH_ENGINE_GENERATE_H_
#define ADJSH_ENGINE_GENERATE_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mamba2_model.h"
#include "common/model.h"
#include "kernels/backend.h"

namespace adjsh {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy (the largest logit, the lowest id among ties)
  int64_t top_k = 0;         // > 0: sample among the k largest logits only
  uint64_t seed = 0;
  int64_t chunk = 256;       // rows per kernel call for the prompt
  int64_t stop_id = -1;      // >= 0: stop after generating this id (it is returned)
  Device device;
};

// The new tokens (at most max_new_tokens). on_token(id) after each, if set: return false to
// stop. INVALID_ARGUMENT for an empty prompt, an id >= V, temperature < 0, top_k < 0 or
// max_new_tokens < 0; the device's errors.
template <typename T>
absl::StatusOr<std::vector<uint32_t>> Generate(
    const ModelParams<T>& params, std::span<const uint32_t> prompt, const GenerateOptions& options,
    const std::function<bool(uint32_t)>& on_token = nullptr);
// A Mamba-2 model's: the device must have a Mamba-2 layer and the head (its errors).
template <typename T>
absl::StatusOr<std::vector<uint32_t>> Generate(
    const Mamba2Params<T>& params, std::span<const uint32_t> prompt,
    const GenerateOptions& options, const std::function<bool(uint32_t)>& on_token = nullptr);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_GENERATE_H_
