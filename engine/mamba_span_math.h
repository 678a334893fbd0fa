// A Mamba-1 span's layer math (the Math of engine/span_work.h's BasicSpanWork): each task's
// chunk loop through the layer's block on the backend (kernels/backend.h BlockBackend), and
// what it keeps besides the span's rows: the state before each of its chunks per layer
// ((chunks, Di, N), in the storage format), and the activations a summary or forward keeps for
// the pass after it within the kept budget (kernels/cpu/kept_pool.h), so that pass skips its
// recompute (the same bits either way).
#ifndef ADJSH_ENGINE_MAMBA_SPAN_MATH_H_
#define ADJSH_ENGINE_MAMBA_SPAN_MATH_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/model.h"
#include "engine/span_state.h"
#include "kernels/backend.h"

namespace adjsh {

// A model's layers on a backend, shared by the spans of one step (read-only while they run).
template <typename T>
struct BackendModel {
  const ModelParams<T>* params = nullptr;
  Backend<T>* backend = nullptr;
  std::vector<std::unique_ptr<BlockBackend<T>>> blocks;  // one per layer
  std::vector<T> A;  // per layer (Di, N) = -exp(A_log), for the combines: K x Di x N
  // Builds the blocks of every layer of params on backend (both must outlive it).
  static BackendModel Make(const ModelParams<T>& params, Backend<T>& backend);
};

template <typename T>
class MambaSpanMath {
 public:
  using Value = T;
  using Model = BackendModel<T>;
  using Layer = LayerParams<T>;
  using Outputs = SpanOutputs<T, Layer>;

  MambaSpanMath(const Model& model, const SpanRows<T>& s);

  // From a zero state, chunk by chunk: h~ = P_c . h~ + h_local(c), Sigma the sum of S_c.
  void ForwardSummary(SpanRows<T>& s, int64_t k, Outputs& out);
  // From the true start state h0 (empty: zero): each chunk's start state stored (rounded as the
  // storage rounds) and read back, so the forward goes on from exactly what the backward will
  // read; u^{k+1}'s rows (g's at the top layer) written.
  void Forward(SpanRows<T>& s, int64_t k, const std::vector<T>& h0, bool top);
  // Out of chunk c backwards from zero: m_c + P_c . (what flows into it), last chunk first.
  void BackwardSummary(SpanRows<T>& s, int64_t k, Outputs& out);
  // The chunks from the last, the adjoint mu (empty: zero) into the span's last token: the
  // layer's partial, dL/du^k rows into du (len, D), then the halo parts of later chunks added
  // in chunk order; the parts reaching before t0 become out.du_halo_prev.
  void Backward(SpanRows<T>& s, int64_t k, const std::vector<T>& mu, Outputs& out, T* du);
  void DropLayer(int64_t k);  // after layer k's backward
  int64_t kept_bytes() const;

 private:
  // Hands back what an earlier summary kept and makes room (all null) for what the summary
  // `phase` of layer k is about to keep.
  void StartKeeping(SpanPhase phase, int64_t k, int64_t chunks);
  // Takes chunk i's kept set if the summary `phase` of layer k left one (else null).
  std::unique_ptr<KeptActs> TakeKept(SpanPhase phase, int64_t k, int64_t i);

  const Model& model_;
  const MambaConfig& cfg_;
  const int64_t DiN_;
  std::vector<StoredRows<T>> states_;  // K x (chunks, Di, N)
  // What the last summary task kept per chunk (c - c0) for the pass after it (kernels/backend.h
  // KeptActs): that summary's phase and layer; entries are null where nothing was kept.
  std::vector<std::unique_ptr<KeptActs>> kept_;
  SpanPhase kept_phase_ = SpanPhase::kForwardSummary;
  int64_t kept_layer_ = -1;
  // What each layer's kForward carried per chunk for its kBackwardSummary (kernels/backend.h
  // ForwardKept): K x chunks, null where nothing was carried (a budget spent, or taken).
  std::vector<std::vector<std::unique_ptr<KeptActs>>> carried_;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MAMBA_SPAN_MATH_H_
