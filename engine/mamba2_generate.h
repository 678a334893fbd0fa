// Recurrent decoding of a Mamba-2 model: the prompt in chunks, then one token at a time, each
// through every layer with its heads' states and conv halo (engine/mamba2_stream.h): constant
// work and memory per token. Sampling as Generate's (engine/sample.h): the same seed, the same
// tokens.
#ifndef ADJSH_ENGINE_MAMBA2_GENERATE_H_
#define ADJSH_ENGINE_MAMBA2_GENERATE_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/generate.h"
#include "common/mamba2_model.h"

namespace adjsh {

// As Generate (engine/generate.h), the layers and the head on options.device (its errors:
// a device without a Mamba-2 layer, f64 on a GPU).
template <typename T>
absl::StatusOr<std::vector<uint32_t>> Mamba2Generate(
    const Mamba2Params<T>& params, std::span<const uint32_t> prompt,
    const GenerateOptions& options, const std::function<bool(uint32_t)>& on_token = nullptr);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MAMBA2_GENERATE_H_
