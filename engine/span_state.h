// What every span owner shares, whatever its model type (engine/span_work.h): a task's inputs
// and outputs, and the rows a span keeps of every layer. Per span s with rows [t0, t0 + len)
// and conv halo H = min(W - 1, t0):
//   kept   u^k (H + len, D) for k = 0..K-1 in the storage format (halo rows first, from the
//          coordinator), g (len, D) in the compute type: u^K, then dL/du^K from the head, then
//          dL/du^k as the backward goes down; and what the model type's layer math keeps
//          (engine/span_math.h); all of it in the model's row space (kernels/row_space.h: the
//          host's, or a GPU's for a resident model).
//   sent   only (Di, N)-sized summaries, halo rows and parameter partials (SpanOutputs).
#ifndef ADJSH_ENGINE_SPAN_STATE_H_
#define ADJSH_ENGINE_SPAN_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model.h"
#include "engine/grad_options.h"
#include "engine/span_plan.h"
#include "engine/stored_rows.h"

namespace adjsh {

// What a task receives (every field small: O(W D + Di N)).
template <typename T>
struct SpanInputs {
  std::vector<T> halo_u;   // forward, k > 0: (H, D) the last rows of u^k of span s - 1
  std::vector<T> h0;       // kForward: (Di, N) the state before t0; empty = zero (span 0)
  std::vector<T> du_halo;  // backward, k < K-1: (H(s+1), D) span s + 1's part of dL/du^{k+1}
                           // of this span's last rows; empty for the last span
  std::vector<T> mu;       // kBackward: (Di, N) the adjoint into the span's last token; empty = 0
};

// What a task returns. Layer: the model type's layer struct (LayerParams for Mamba-1,
// Mamba2Layer for Mamba-2); a Mamba-2 span's summaries have the same shapes with Di = H P
// (sigma repeats each head's dt sum over its P channels).
template <typename T, typename Layer = LayerParams<T>>
struct SpanOutputs {
  std::vector<T> sigma, h_end;  // kForwardSummary: (Di) delta sums, (Di, N) end state from zero
  std::vector<T> halo_next;     // kForward, k < K-1: (min(W-1, len), D) the last rows of u^{k+1}
  double loss_sum = 0;          // kForward at k = K-1: the head's loss over the span's targets,
  int64_t correct = 0;          // how many have the largest logit (with a loss mask), and
  std::vector<T> embed, norm_f;  // its (V, D) and (D) partials; kBackward at k = 0: embed is
                                 // the (V, D) partial of the embedding lookup
  std::vector<T> m;             // kBackwardSummary: (Di, N)
  Layer grad;                   // kBackward: layer k's partial over the span
  // A resident span's (V, D) partial (embed's) and layer partial (its tensors back to back:
  // ChunkOps::grad_size) where its rows are, instead of embed and grad, when its owner was
  // asked to leave them there (engine/span_work.h Run).
  RowBuffer<T> embed_sum, grad_sum;
  T partials_nonfinite = 0;  // with embed_sum or grad_sum: 1 where either holds a NaN or an Inf
  std::vector<T> du_halo_prev;  // kBackward, s > 0: (H, D) for span s - 1's last rows of dL/du^k
};

// n stored values on the heap, or spilled when a directory is given and the disk takes them
// (else in memory, saying so on stderr); in a device's memory for a device space.
template <typename T>
StoredRows<T> MakeSpanRows(size_t n, Storage storage, const std::string& spill_dir,
                           RowSpace<T>& space);

// The rows a span keeps of every layer, and its place in the step: what the span owner
// (engine/span_work.h) and its model type's layer math read and write.
template <typename T>
struct SpanRows {
  // tokens: ids [t0 - H, min(T, t0 + len + 1)); mask: empty, or the loss mask over the same
  // positions. K layers of width D; u[0] is left for the owner to fill (the embedding rows).
  SpanRows(const SpanPlan& plan, int64_t span, int64_t K, int64_t D, std::vector<uint32_t> tokens,
           std::vector<uint8_t> mask, Storage storage, const std::string& spill_dir,
           RowSpace<T>& space);

  const SpanPlan& plan;
  const int64_t span;
  const SpanRange r;  // the span's rows [t0, t0 + len), its conv halo H
  const int64_t D;
  const std::vector<uint32_t> tokens;
  const std::vector<uint8_t> mask;
  const Storage storage;
  RowSpace<T>& space;
  std::vector<StoredRows<T>> u;  // K x (H + len, D)
  RowBuffer<T> g;                // (len, D)

  int64_t base() const { return r.t0 - r.halo; }  // the token of u[k]'s row 0
  // The rows chunk c reads of u^k (its conv halo, then its own), through scratch when the
  // storage rounds.
  // next: the chunk of layer k the caller reads next with this scratch (none: outside the
  // span's chunks), whose rows may start coming now (StoredRows::Read).
  const T* ChunkRows(int64_t k, int64_t c, std::vector<T>& scratch, int64_t next = -1) const;
};

// Whether a span whose forward has run layers [0, forward_done) and whose g holds
// dL/du^{g_layer} (-1: not yet; K: from the head) keeps what `task` reads.
bool SpanTaskReady(const SpanTask& task, int64_t K, int64_t forward_done, int64_t g_layer);
// FAILED_PRECONDITION saying why span `span` cannot run `task`.
absl::Status SpanNotReady(int64_t span, const SpanTask& task, int64_t forward_done,
                          int64_t g_layer);
// The head's targets of a span's rows r [t0, t0 + len): token t + 1 of the sequence, or -1
// where there is none (the last token) or the mask does not count it. tokens (and mask, empty
// or over the same positions) start at t0 - r.halo, as a span's owner keeps them.
std::vector<int64_t> SpanTargets(const SpanPlan& plan, const SpanRange& r,
                                 const std::vector<uint32_t>& tokens,
                                 const std::vector<uint8_t>& mask);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPAN_STATE_H_
