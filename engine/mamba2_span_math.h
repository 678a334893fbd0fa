// A Mamba-2 span's layer math (the Math of engine/span_work.h's BasicSpanWork): each task's
// chunk loop through the layer's chunk ops (kernels/mamba2_backend.h Mamba2ChunkOps), and what
// it keeps besides the span's rows: each layer's start state (H P N) from its kForward and,
// while layer k's backward runs, the states at its chunk starts ((chunks, H P N)), rebuilt from
// the start state by a forward sweep (docs/MATH.md "Mamba-2"). The gradient of the next span's
// conv halo rows (the conv reads this span's last W - 1 rows) is taken through in_proj and the
// pre-norm by the span that reads them (HaloBackward) and sent back as dL/du rows, as Mamba-1's
// spans do.
#ifndef ADJSH_ENGINE_MAMBA2_SPAN_MATH_H_
#define ADJSH_ENGINE_MAMBA2_SPAN_MATH_H_

#include <cstdint>
#include <vector>

#include "common/mamba2_model.h"
#include "engine/span_state.h"
#include "kernels/cpu/mamba2_layer.h"
#include "kernels/mamba2_backend.h"

namespace adjsh {

template <typename T>
class Mamba2SpanMath {
 public:
  using Value = T;
  using Model = Mamba2BackendModel<T>;
  using Layer = Mamba2Layer<T>;
  using Outputs = SpanOutputs<T, Layer>;

  Mamba2SpanMath(const Model& model, const SpanRows<T>& s);

  // From a zero state through the span's chunks: the end state, and each head's dt summed over
  // the span (sigma: repeated over the head's P channels).
  void ForwardSummary(SpanRows<T>& s, int64_t k, Outputs& out);
  // From the true start state h0 (empty: zero), kept for the backward; u^{k+1}'s rows (g's at
  // the top layer) written, with the residual (the stored input) added.
  void Forward(SpanRows<T>& s, int64_t k, const std::vector<T>& h0, bool top);
  // The adjoint carry out of the span from zero, last chunk first.
  void BackwardSummary(SpanRows<T>& s, int64_t k, Outputs& out);
  // The chunks from the last with the carry mu (empty: zero): the layer's partial, dL/du^k rows
  // into du (len, D), and the conv halo's gradient, rows [t0 - H, t0) of span s - 1, through
  // their in_proj and pre-norm as out.du_halo_prev.
  void Backward(SpanRows<T>& s, int64_t k, const std::vector<T>& mu, Outputs& out, T* du);
  void DropLayer(int64_t k);  // after layer k's backward
  int64_t kept_bytes() const;

 private:
  void ChunkStates(SpanRows<T>& s, int64_t k);  // chunk_states_ for layer k, from its start

  const Model& m_;
  const Mamba2Config& cfg_;
  const Mamba2Dims d_;
  const int64_t HPN_;
  std::vector<std::vector<T>> start_;  // K x (H P N), from each layer's kForward
  std::vector<T> chunk_states_;        // (chunks, H P N) of layer states_layer_
  int64_t states_layer_ = -1;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MAMBA2_SPAN_MATH_H_
