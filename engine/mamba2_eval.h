// Evaluation of a Mamba-2 model: the mean next-token loss of a token corpus, forward only. Each
// sequence streams through the layers one chunk at a time (kernels/cpu/mamba2_layer.h), every layer
// carrying only its heads' states (H, P, N) and its input's last W - 1 rows (the conv halo)
// from one chunk to the next: memory is bounded by the chunk at any context length. The loss
// is summed in chunk order. One thread (the chunk forward's GEMMs are single-threaded), the
// layers and the head on options.device (kernels/mamba2_backend.h).
#ifndef ADJSH_ENGINE_MAMBA2_EVAL_H_
#define ADJSH_ENGINE_MAMBA2_EVAL_H_

#include "absl/status/statusor.h"
#include "common/token_data.h"
#include "engine/evaluate.h"
#include "common/mamba2_model.h"

namespace adjsh {

// As Evaluate (engine/evaluate.h): options' chunk, context, max_tokens, progress and device
// (threads are not used). INVALID_ARGUMENT for fewer than 2 tokens, an id >= V, chunk < 1 or
// context 1; the device's errors (a device without a Mamba-2 layer, f64 on a GPU).
template <typename T>
absl::StatusOr<EvalResult> Mamba2Evaluate(const Mamba2Params<T>& params, const TokenData& tokens,
                                          const EvalOptions& options);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MAMBA2_EVAL_H_
