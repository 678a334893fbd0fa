#include "engine/span_work.h"

#include <algorithm>
#include <utility>

#include "common/check.h"
#include "kernels/cpu/lm_head.h"

namespace adjsh {

template <typename Math>
BasicSpanWork<Math>::BasicSpanWork(const Model& model, const SpanPlan& plan, int64_t span,
                                   std::vector<uint32_t> tokens, std::vector<uint8_t> mask,
                                   int64_t n_targets, Storage storage, std::string spill_dir)
    : model_(model),
      K_(model.params->config.num_hidden_layers),
      W_(model.params->config.conv_kernel),
      n_targets_(n_targets),
      rows_(plan, span, K_, model.params->config.hidden_size, std::move(tokens), std::move(mask),
            storage, spill_dir),
      math_(model, rows_) {
  const int64_t D = rows_.D;
  const std::vector<T>& E = model_.params->embed;
  for (int64_t t = 0; t < rows_.r.halo + rows_.r.len; ++t)
    rows_.u[0].Commit(t * D, D, E.data() + int64_t{rows_.tokens[t]} * D);
}

template <typename Math>
bool BasicSpanWork<Math>::Ready(const SpanTask& task) const {
  return SpanTaskReady(task, K_, forward_done_, g_layer_);
}

template <typename Math>
absl::Status BasicSpanWork<Math>::Run(const SpanTask& task, const SpanInputs<T>& in,
                                      Outputs& out) {
  if (task.span != rows_.span || !Ready(task))
    return SpanNotReady(rows_.span, task, forward_done_, g_layer_);
  const int64_t k = task.layer;
  switch (task.phase) {
    case SpanPhase::kForwardSummary:
      SetHalo(k, in);
      math_.ForwardSummary(rows_, k, out);
      break;
    case SpanPhase::kForward:
      SetHalo(k, in);
      Forward(k, in, out);
      break;
    case SpanPhase::kBackwardSummary:
      AddNextHalo(in);
      math_.BackwardSummary(rows_, k, out);
      break;
    case SpanPhase::kBackward:
      AddNextHalo(in);
      Backward(k, in, out);
      break;
  }
  return absl::OkStatus();
}

// Rows [0, H) of u^k: the previous span's last rows (layer 0 has them from the tokens).
template <typename Math>
void BasicSpanWork<Math>::SetHalo(int64_t k, const SpanInputs<T>& in) {
  const int64_t H = rows_.r.halo, D = rows_.D;
  if (k == 0 || H == 0) return;
  ADJSH_CHECK(static_cast<int64_t>(in.halo_u.size()) == H * D, "halo_u has the wrong size");
  rows_.u[k].Commit(0, H * D, in.halo_u.data());
}

// Span s + 1's part of dL/du^{k+1} of the last rows, once per layer.
template <typename Math>
void BasicSpanWork<Math>::AddNextHalo(const SpanInputs<T>& in) {
  if (next_halo_added_) return;
  next_halo_added_ = true;
  const int64_t D = rows_.D, n = static_cast<int64_t>(in.du_halo.size()) / D;
  ADJSH_CHECK(n <= rows_.r.len, "du_halo longer than the span");
  T* last = rows_.g.data() + (rows_.r.len - n) * D;
  for (int64_t q = 0; q < n * D; ++q) last[q] += in.du_halo[q];
}

// From the true start state; the top layer's output goes to g and on to the head, any other's
// last W - 1 rows to span s + 1 (its conv halo).
template <typename Math>
void BasicSpanWork<Math>::Forward(int64_t k, const SpanInputs<T>& in, Outputs& out) {
  const int64_t D = rows_.D, len = rows_.r.len;
  const bool top = k + 1 == K_;
  if (top) rows_.g.assign(len * D, T(0));
  math_.Forward(rows_, k, in.h0, top);
  forward_done_ = std::max(forward_done_, k + 1);
  if (top) {
    Head(out);
    return;
  }
  thread_local std::vector<T> scratch;
  const int64_t n = std::min(W_ - 1, len);
  const T* last = rows_.u[k + 1].Read((rows_.r.halo + len - n) * D, n * D, scratch);
  out.halo_next.assign(last, last + n * D);
}

// The LM head over the span's rows through the backend (which blocks rows and vocabulary): the
// loss sum over the span's targets, their greedy count with a mask, dL/du^K into g and the
// head's (V, D) and norm_f's partials (a forward-only plan: the loss sum alone).
template <typename Math>
void BasicSpanWork<Math>::Head(Outputs& out) {
  const auto& p = *model_.params;
  const int64_t D = rows_.D, V = p.config.vocab_size, len = rows_.r.len;
  const std::vector<int64_t> targets =
      SpanTargets(rows_.plan, rows_.r, rows_.tokens, rows_.mask);
  int64_t correct = 0;
  cpu::LmHeadArgs<T> args{len,           D,           V, p.config.layer_norm_epsilon,
                          p.head().data(), p.norm_f.data(), rows_.g.data(), targets.data(),
                          T(1) / T(n_targets_)};
  if (!rows_.mask.empty()) args.correct = &correct;
  if (rows_.plan.forward_only()) {  // an evaluation: no dL/du, no partials
    out.loss_sum = model_.backend->HeadLoss(args);
  } else {
    out.embed.assign(V * D, T(0));
    out.norm_f.assign(D, T(0));
    // The next g goes into the thread's spare buffer, and the old g becomes the spare: one
    // spare per thread, not per span (a fresh (len, D) buffer per task costs page faults).
    thread_local std::vector<T> du;
    du.resize(len * D);
    out.loss_sum = model_.backend->HeadForwardBackward(args, du.data(), out.embed.data(),
                                                       out.norm_f.data());
    std::swap(rows_.g, du);
  }
  out.correct = correct;
  g_layer_ = K_;
  next_halo_added_ = true;  // nothing after the head feeds g
}

// dL/du^k replaces dL/du^{k+1} in g, and layer k's rows go.
template <typename Math>
void BasicSpanWork<Math>::Backward(int64_t k, const SpanInputs<T>& in, Outputs& out) {
  const int64_t D = rows_.D, len = rows_.r.len;
  thread_local std::vector<T> du;  // the thread's spare, as in Head (Backward writes every row)
  du.resize(len * D);
  math_.Backward(rows_, k, in.mu, out, du.data());
  std::swap(rows_.g, du);
  g_layer_ = k;
  next_halo_added_ = false;
  rows_.u[k] = StoredRows<T>();
  math_.DropLayer(k);
  if (k > 0) return;
  // The embedding lookup: dE[token_t] += dL/du^0_t in token order (span s + 1's halo part of
  // the last rows is added by the ledger: it has those rows).
  out.embed.assign(model_.params->config.vocab_size * D, T(0));
  for (int64_t t = 0; t < len; ++t) {
    T* row = out.embed.data() + int64_t{rows_.tokens[rows_.r.halo + t]} * D;
    for (int64_t d = 0; d < D; ++d) row[d] += rows_.g[t * D + d];
  }
}

template <typename Math>
int64_t BasicSpanWork<Math>::kept_bytes() const {
  int64_t b = static_cast<int64_t>(rows_.g.size() * sizeof(T));
  for (const auto& u : rows_.u) b += static_cast<int64_t>(u.bytes());
  return b + math_.kept_bytes();
}

template class BasicSpanWork<SpanMath<ModelParams<float>>>;
template class BasicSpanWork<SpanMath<ModelParams<double>>>;
template class BasicSpanWork<SpanMath<Mamba2Params<float>>>;
template class BasicSpanWork<SpanMath<Mamba2Params<double>>>;

}  // namespace adjsh
