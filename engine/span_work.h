// What the owner of one span keeps and computes (docs/ARCHITECTURE.md "Spans"): a worker, or a
// thread of the in-process engine, runs the span's tasks of engine/span_plan.h on its own rows.
// Per span s with rows [t0, t0 + len) and conv halo H = min(W - 1, t0):
//   kept   u^k (H + len, D) for k = 0..K-1 in the storage format (halo rows first, from the
//          coordinator), the state before each of its chunks per layer ((chunks, Di, N), same
//          format), g (len, D) in the compute type: u^K, then dL/du^K from the head, then
//          dL/du^k as the backward goes down.
//   sent   only (Di, N)-sized summaries, halo rows and parameter partials (SpanOutputs).
// Every kernel call goes through the backend (kernels/backend.h). A task is a pure function of
// the span's kept values and its SpanInputs, so whoever runs it, it returns the same bits.
#ifndef ADJSH_ENGINE_SPAN_WORK_H_
#define ADJSH_ENGINE_SPAN_WORK_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model.h"
#include "engine/grad_options.h"
#include "engine/span_plan.h"
#include "engine/stored_rows.h"
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
// Mamba2Layer for Mamba-2, engine/mamba2_span_work.h); a Mamba-2 span's summaries have the same
// shapes with Di = H P (sigma repeats each head's dt sum over its P channels).
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
  std::vector<T> du_halo_prev;  // kBackward, s > 0: (H, D) for span s - 1's last rows of dL/du^k
};

// What a span's owner of either model type (SpanWork, Mamba2SpanWork) shares:
// Whether a span whose forward has run layers [0, forward_done) and whose g holds
// dL/du^{g_layer} (-1: not yet; K: from the head) keeps what `task` reads.
bool SpanTaskReady(const SpanTask& task, int64_t K, int64_t forward_done, int64_t g_layer);
// FAILED_PRECONDITION saying why span `span` cannot run `task`.
absl::Status SpanNotReady(int64_t span, const SpanTask& task, int64_t forward_done,
                          int64_t g_layer);
// n stored values on the heap, or spilled when a directory is given and the disk takes them
// (else in memory, saying so on stderr).
template <typename T>
StoredRows<T> MakeSpanRows(size_t n, Storage storage, const std::string& spill_dir);
// The head's targets of a span's rows r [t0, t0 + len): token t + 1 of the sequence, or -1
// where there is none (the last token) or the mask does not count it. tokens (and mask, empty
// or over the same positions) start at t0 - r.halo, as a span's owner keeps them.
std::vector<int64_t> SpanTargets(const SpanPlan& plan, const SpanRange& r,
                                 const std::vector<uint32_t>& tokens,
                                 const std::vector<uint8_t>& mask);
// Adds span s + 1's part of dL/du of this span's last rows, du_halo (n, D), into g (len, D).
template <typename T>
void AddNextSpanHalo(const std::vector<T>& du_halo, int64_t len, int64_t D, std::vector<T>& g);

// The head task of a span of either model type: the LM head over its rows r through backend
// (which blocks rows and vocabulary), with the head's (V, D) weights E and norm_f (D). g (len,
// D) holds u^K and then dL/du^K; out gets the loss sum over the span's targets, their greedy
// count with a mask, and the head's and norm_f's partials (a forward-only plan: the loss sum
// alone, g untouched).
template <typename T>
struct SpanHeadArgs {
  Backend<T>* backend;
  const T* E;
  const T* norm_f;
  int64_t V, D;
  double eps;
};
template <typename T, typename Layer>
void RunSpanHead(const SpanHeadArgs<T>& head, const SpanPlan& plan, const SpanRange& r,
                 const std::vector<uint32_t>& tokens, const std::vector<uint8_t>& mask,
                 int64_t n_targets, std::vector<T>& g, SpanOutputs<T, Layer>& out);

template <typename T>
class SpanWork {
 public:
  // tokens: ids [t0 - H, min(T, t0 + len + 1)) (the rows, their halo, and the next span's first
  // token: the last row's target); mask: empty, or the loss mask over the same positions.
  // n_targets: the targets counted over the whole sequence (the loss is their mean).
  SpanWork(const BackendModel<T>& model, const SpanPlan& plan, int64_t span,
           std::vector<uint32_t> tokens, std::vector<uint8_t> mask, int64_t n_targets,
           Storage storage, std::string spill_dir);

  // Whether the kept values are those `task` reads: its layer's forward has not run yet
  // (forward), or the backward has come down to its layer (backward). Otherwise the span must
  // be rebuilt (a fresh SpanWork replayed up to the task).
  bool Ready(const SpanTask& task) const;
  // Runs the task (Ready must hold: FAILED_PRECONDITION otherwise). out's buffers are resized.
  absl::Status Run(const SpanTask& task, const SpanInputs<T>& in, SpanOutputs<T>& out);

  int64_t kept_bytes() const;  // what the span holds now

 private:
  void Forward(int64_t k, const SpanInputs<T>& in, SpanOutputs<T>& out, bool summary);
  void Head(SpanOutputs<T>& out);
  void Backward(int64_t k, const SpanInputs<T>& in, SpanOutputs<T>& out, bool summary);
  void SetHalo(int64_t k, const SpanInputs<T>& in);
  void AddNextHalo(const SpanInputs<T>& in);

  const BackendModel<T>& model_;
  const MambaConfig& cfg_;
  const SpanPlan& plan_;
  const int64_t s_;
  const SpanRange r_;
  const std::vector<uint32_t> tokens_;
  const std::vector<uint8_t> mask_;
  const int64_t n_targets_, D_, DiN_;
  const Storage storage_;
  const std::string spill_dir_;
  std::vector<StoredRows<T>> u_;       // K x (H + len, D)
  std::vector<StoredRows<T>> states_;  // K x (chunks, Di, N)
  std::vector<T> g_;                   // (len, D)
  // What the last summary task kept per chunk (c - c0) for the pass after it (kernels/backend.h
  // KeptActs): that summary's phase and layer; entries are null where nothing was kept.
  std::vector<std::unique_ptr<KeptActs>> kept_;
  // What each layer's kForward carried per chunk for its kBackwardSummary (kernels/backend.h
  // ForwardKept): K x chunks, null where nothing was carried (a budget spent, or taken).
  std::vector<std::vector<std::unique_ptr<KeptActs>>> carried_;
  SpanPhase kept_phase_ = SpanPhase::kForwardSummary;
  int64_t kept_layer_ = -1;
  // Hands back what an earlier summary kept and makes room (all null) for what the summary
  // `phase` of layer k is about to keep.
  void StartKeeping(SpanPhase phase, int64_t k);
  // Takes chunk i's kept set if the summary `phase` of layer k left one (else null).
  std::unique_ptr<KeptActs> TakeKept(SpanPhase phase, int64_t k, int64_t i);
  int64_t forward_done_ = 0;           // layers whose kForward ran (u^0..u^{forward_done_} kept)
  int64_t g_layer_ = -1;               // g holds dL/du^{g_layer_} (K after the head), or -1
  bool next_halo_added_ = false;       // span s + 1's part of g is in
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPAN_WORK_H_
