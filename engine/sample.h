// Drawing the next token from the head's logits, for the decoder of either model type
// (engine/generate.h): the same seed and logits give the same token.
#ifndef ADJSH_ENGINE_SAMPLE_H_
#define ADJSH_ENGINE_SAMPLE_H_

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/generate.h"

namespace adjsh {

// An index of `logits` (V): greedy at temperature 0 (the largest, the lowest id among ties),
// else softmax(logits / temperature) over the top_k largest (all when 0), with one uniform draw
// of rng.
template <typename T>
uint32_t SampleToken(const std::vector<T>& logits, const GenerateOptions& o, std::mt19937_64& rng);

// What every decoder checks first: INVALID_ARGUMENT for an empty prompt, an id >= vocab_size
// (in the prompt, or as stop_id), temperature < 0, top_k < 0, max_new_tokens < 0 or chunk < 1.
absl::Status CheckGenerateInputs(std::span<const uint32_t> prompt, int64_t vocab_size,
                                 const GenerateOptions& o);

// The decoding after the prompt was fed: logits(v) writes the next token's logits (V), feed(id)
// runs a drawn token through the model; each drawn id goes to on_token (if set; false stops),
// up to max_new_tokens, or through stop_id.
template <typename T>
std::vector<uint32_t> DecodeTokens(const GenerateOptions& o, int64_t vocab_size,
                                   const std::function<void(std::vector<T>&)>& logits,
                                   const std::function<void(uint32_t)>& feed,
                                   const std::function<bool(uint32_t)>& on_token);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SAMPLE_H_
