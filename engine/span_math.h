// A span's layer math (the Math of engine/span_work.h's BasicSpanWork), for any model type: each
// task's loop over the span's chunks through the layer's op table (kernels/chunk_ops.h), and
// what the span keeps besides its rows:
//   - the chunks' start states of each layer for the backward: every chunk's from the forward
//     ((chunks, state), in the storage format, so the forward goes on from exactly what the
//     backward reads) where the op table keeps_chunk_states(); else each layer's start state,
//     the chunks' rebuilt from it by a forward sweep when layer k's backward comes;
//   - what a summary or forward kept for the pass after it on the same rows (the backend's kept
//     budget; the same bits either way);
//   - the conv halo's gradient handed to earlier rows: per chunk as rows of du (HaloGrad::kRows,
//     added in chunk order) or carried through the chunks and, at the span's start, through
//     span s - 1's rows (kCarried); the part for span s - 1 goes out as du_halo_prev.
// Every state, adjoint and row it keeps or passes between calls is in the model's row space
// (kernels/row_space.h); a task's inputs go in and its outputs come out through the space, so
// on a GPU a task moves only those (the span owner's Finish brings them to the host).
#ifndef ADJSH_ENGINE_SPAN_MATH_H_
#define ADJSH_ENGINE_SPAN_MATH_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/span_state.h"
#include "kernels/chunk_ops.h"

namespace adjsh {

template <typename Params>
class SpanMath {
 public:
  using Model = LayerModel<Params>;
  using Value = typename Model::Value;
  using Layer = typename Model::Layer;
  using T = Value;
  using Outputs = SpanOutputs<T, Layer>;

  SpanMath(const Model& model, const SpanRows<T>& s);

  // From a zero state through the span's chunks: the end state and the delta sums Sigma.
  void ForwardSummary(SpanRows<T>& s, int64_t k, Outputs& out);
  // From the true start state h0 (empty: zero): u^{k+1}'s rows (g's at the top layer) written.
  void Forward(SpanRows<T>& s, int64_t k, const std::vector<T>& h0, bool top);
  // The adjoint out of the span from zero, last chunk first.
  void BackwardSummary(SpanRows<T>& s, int64_t k, Outputs& out);
  // The chunks from the last with the adjoint mu (empty: zero) into the span's last token: the
  // layer's partial (out.grad, or for a resident model out.grad_sum), dL/du^k rows into du
  // (len, D), the conv halo's part for span s - 1 as out.du_halo_prev.
  void Backward(SpanRows<T>& s, int64_t k, const std::vector<T>& mu, Outputs& out, T* du);
  void DropLayer(int64_t k);  // after layer k's backward
  int64_t kept_bytes() const;

 private:
  // The state before chunk i (c - c0) of layer k, in the row space (scratch: the storage's read
  // buffer).
  const T* ChunkStart(SpanRows<T>& s, int64_t k, int64_t i, std::vector<T>& scratch);
  // Hands back what an earlier summary kept and makes room (all null) for what the summary
  // `phase` of layer k is about to keep.
  void StartKeeping(SpanPhase phase, int64_t k, int64_t chunks);
  // Takes chunk i's kept set if the summary `phase` of layer k left one (else null).
  std::unique_ptr<KeptActs> TakeKept(SpanPhase phase, int64_t k, int64_t i);

  const Model& model_;
  const int64_t S_;  // the state's size
  const bool keeps_chunk_states_;
  RowSpace<T>& space_;                  // the model's row space, where all of these are
  std::vector<StoredRows<T>> states_;   // keeps_chunk_states_: K x (chunks, S)
  std::vector<RowBuffer<T>> start_;     // otherwise: K x (S) from each layer's kForward, and
  RowBuffer<T> rebuilt_;                // (chunks, S) of layer rebuilt_layer_
  int64_t rebuilt_layer_ = -1;
  // What the last summary task kept per chunk for the pass after it (that summary's phase and
  // layer), and what each layer's kForward carried per chunk for its kBackwardSummary
  // (K x chunks); null where nothing was kept.
  std::vector<std::unique_ptr<KeptActs>> kept_;
  SpanPhase kept_phase_ = SpanPhase::kForwardSummary;
  int64_t kept_layer_ = -1;
  std::vector<std::vector<std::unique_ptr<KeptActs>>> carried_;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPAN_MATH_H_
