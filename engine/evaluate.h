// Evaluation: the mean next-token loss of a token corpus under a model, forward only. Nothing
// per token is kept: each sequence streams through the layers one chunk at a time, every layer
// carrying only its state (Di, N) and its input's last W - 1 rows (the conv halo) from one chunk
// to the next, so memory is bounded by the chunk at any context length. The (layer, chunk)
// forwards run as a wavefront on threads (chunk c of layer k beside chunk c + 1 of layer k - 1);
// the loss is summed in chunk order, so the result does not depend on the thread count.
#ifndef ADJSH_ENGINE_EVALUATE_H_
#define ADJSH_ENGINE_EVALUATE_H_

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mamba2_model.h"
#include "common/model.h"
#include "common/token_data.h"
#include "kernels/backend.h"

namespace adjsh {

struct EvalOptions {
  int64_t chunk = 256;    // C: tokens per kernel call
  int64_t context = 0;    // T: tokens per sequence; 0: the whole corpus is one sequence
  int64_t max_tokens = 0;  // > 0: only the corpus's first max_tokens tokens
  int threads = 0;        // 0: one per hardware thread
  Device device;
  // Document starts (ascending token offsets) where the recurrence and the conv reset, as a
  // model trained with --doc-boundaries reset reads (engine/segments.h PiecesAtStarts): each
  // sequence's loss is its pieces' (the same targets); empty: none.
  std::span<const int64_t> doc_starts;
  // After each sequence: (tokens evaluated, tokens to evaluate); never two calls at once.
  std::function<void(int64_t, int64_t)> progress;
};

struct EvalResult {
  double loss_sum = 0;    // sum over the targets of -log p(target)
  int64_t targets = 0;    // next-token targets: T - 1 per sequence of T tokens
  int64_t sequences = 0;  // the corpus cut into sequences of the context (the last one shorter)
  int64_t tokens = 0;
  double loss() const { return targets > 0 ? loss_sum / static_cast<double>(targets) : 0; }
};

// The sequences an evaluation of the first `n` tokens cuts them into, {first token, tokens}:
// `context` tokens each (0: one sequence of all n), the last one shorter; a last sequence of
// one token predicts nothing and is left out. Evaluate's, and the trainer's through workers.
std::vector<std::pair<int64_t, int64_t>> EvalSequences(int64_t n, int64_t context);

// The tokens an evaluation with `options` reads (the first max_tokens, or all): INVALID_ARGUMENT
// for chunk < 1, context 1 or negative, max_tokens < 0, or fewer than 2 tokens: Evaluate's
// check.
absl::StatusOr<int64_t> EvalTokenCount(const TokenData& tokens, const EvalOptions& options);

// The loss of the first n tokens in EvalSequences(n, options.context), each sequence cut into
// pieces at options.doc_starts: sequence_loss(start, len, rows_done) returns one sequence's (or
// piece's) loss sum and calls rows_done(rows) as it goes (which
// reports options.progress); the sums are added in sequence order: Evaluate's loop.
using SequenceLossFn = std::function<double(int64_t start, int64_t len,
                                            const std::function<void(int64_t rows)>& rows_done)>;
EvalResult SumSequenceLosses(int64_t n, const EvalOptions& options,
                             const SequenceLossFn& sequence_loss);

// A last sequence of one token predicts nothing and is left out. INVALID_ARGUMENT for fewer than
// 2 tokens to evaluate, an id >= V, chunk < 1 or context 1; the device's errors (UNIMPLEMENTED /
// FAILED_PRECONDITION).
// Either model type: a Mamba-2 model's layers carry their heads' states (H, P, N) and the
// device must have a Mamba-2 layer (kernels/mamba2_chunk_ops.h).
template <typename T>
absl::StatusOr<EvalResult> Evaluate(const ModelParams<T>& params, const TokenData& tokens,
                                    const EvalOptions& options);
template <typename T>
absl::StatusOr<EvalResult> Evaluate(const Mamba2Params<T>& params, const TokenData& tokens,
                                    const EvalOptions& options);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_EVALUATE_H_
