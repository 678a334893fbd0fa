// Gradients of several token sequences combined into one, and a sequence cut at document
// starts. The loss of a combination is the mean over every counted target of its parts, so its
// gradient is sum_i (n_i / n) g_i, with g_i part i's gradient (of its own mean loss) and n_i its
// targets: accumulated in f32 (or the compute type) in part order, so that the result is
// bitwise the same wherever each part was computed.
//
// A document boundary that resets (`--doc-boundaries reset`): neither the recurrence nor the
// causal conv reads across it, so the model's rows of each document depend on that document
// alone, exactly as if it were a sequence of its own. The masked sequence's loss and gradient
// are therefore those of its pieces combined: piece [a, b) runs as the tokens [a, b] (its last
// row's target is the next piece's first token; the extra row's own output feeds nothing), the
// last piece as [a, T).
#ifndef ADJSH_ENGINE_SEGMENTS_H_
#define ADJSH_ENGINE_SEGMENTS_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/grad_options.h"
#include "engine/grad_result.h"

namespace adjsh {

// One sequence of a batch, as a gradient source takes it (train/trainer.h, the TaskService's
// ComputeGradients): its tokens and its own options (a loss mask is the piece's slice).
struct GradPiece {
  std::span<const uint32_t> tokens;
  GradOptions options;
};

// The pieces of a sequence of T tokens cut at `starts` (document starts relative to the
// sequence, ascending; those outside (0, T) are ignored): {first token, token count} of each
// piece's gradient call, in order. Pieces that would predict nothing (one token at the end) are
// left out.
std::vector<std::pair<int64_t, int64_t>> PiecesAtStarts(int64_t T, std::span<const int64_t> starts);

// The pieces of the window [start, start + len) of a longer sequence whose documents begin at
// `doc_starts` (ascending offsets in that sequence; empty: the window is one piece):
// PiecesAtStarts of the starts inside the window, the pieces relative to it. A training step's
// windows and an evaluation's sequences are cut so (train/trainer.cc, engine/evaluate.cc).
std::vector<std::pair<int64_t, int64_t>> PiecesOfWindow(int64_t start, int64_t len,
                                                        std::span<const int64_t> doc_starts);

// The parts' combination (at least one part; parts are consumed). One part is returned as it is.
// For either model type (ModelParams, Mamba2Params: common/mamba2_model.h).
template <typename T, template <typename> class Params>
GradResult<T, Params> CombineGradients(std::vector<GradResult<T, Params>> parts);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SEGMENTS_H_
