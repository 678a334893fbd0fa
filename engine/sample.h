// Drawing the next token from the head's logits, for every decoder (engine/generate.h,
// engine/mamba2_generate.h): the same seed and logits give the same token.
#ifndef ADJSH_ENGINE_SAMPLE_H_
#define ADJSH_ENGINE_SAMPLE_H_

#include <cstdint>
#include <random>
#include <vector>

#include "engine/generate.h"

namespace adjsh {

// An index of `logits` (V): greedy at temperature 0 (the largest, the lowest id among ties),
// else softmax(logits / temperature) over the top_k largest (all when 0), with one uniform draw
// of rng.
template <typename T>
uint32_t SampleToken(const std::vector<T>& logits, const GenerateOptions& o, std::mt19937_64& rng);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SAMPLE_H_
