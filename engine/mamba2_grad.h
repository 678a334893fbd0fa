// The exact gradient of a Mamba-2 model's mean next-token loss over one token sequence,
// in-process on the CPU (docs/MATH.md "Mamba-2"). The forward keeps each layer's input u^k
// (T, D); the backward runs the layers from the top down, each chunk by chunk in reverse
// (engine/mamba2_layer.h): a forward sweep of the layer keeps its heads' states at the chunk
// starts ((T / C) H P N numbers), and each chunk recomputes its own activations from its input
// rows and its start states. Memory: (K + 3) T D numbers, those states, and one chunk's
// activations.
#ifndef ADJSH_ENGINE_MAMBA2_GRAD_H_
#define ADJSH_ENGINE_MAMBA2_GRAD_H_

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "engine/mamba2_model.h"

namespace adjsh {

template <typename T>
struct Mamba2GradResult {
  double loss = 0;       // mean over the T - 1 next-token targets
  int64_t targets = 0;
  Mamba2Params<T> grad;  // dloss/dparam, every parameter
};

// tokens: at least 2, each below vocab_size; chunk >= 1 (clamped to T). INVALID_ARGUMENT
// naming the problem otherwise.
template <typename T>
absl::StatusOr<Mamba2GradResult<T>> Mamba2Gradient(const Mamba2Params<T>& params,
                                                   std::span<const uint32_t> tokens,
                                                   int64_t chunk);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MAMBA2_GRAD_H_
