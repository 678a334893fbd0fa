#include "engine/span_work.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/mamba2_model.h"
#include "engine/decay.h"

namespace adjsh {

template <typename T>
BackendModel<T> BackendModel<T>::Make(const ModelParams<T>& params, Backend<T>& backend) {
  BackendModel<T> m;
  m.params = &params;
  m.backend = &backend;
  for (const LayerParams<T>& layer : params.layers)
    m.blocks.push_back(backend.MakeBlock(params.config, layer));
  m.A = DecayRates(params);
  return m;
}

bool SpanTaskReady(const SpanTask& task, int64_t K, int64_t forward_done, int64_t g_layer) {
  const int64_t k = task.layer;
  switch (task.phase) {
    case SpanPhase::kForwardSummary:  // reads u^k, which stays until layer k's backward
      return forward_done >= k && (g_layer < 0 || g_layer > k);
    case SpanPhase::kForward:  // rewrites u^{k+1} (or g): only before the backward began
      return forward_done >= k && (g_layer < 0 || g_layer == K);
    case SpanPhase::kBackwardSummary:
    case SpanPhase::kBackward:
      return forward_done == K && g_layer == k + 1;
  }
  return false;
}

absl::Status SpanNotReady(int64_t span, const SpanTask& task, int64_t forward_done,
                          int64_t g_layer) {
  return absl::FailedPreconditionError(absl::StrCat(
      "span ", span, " cannot run ", std::string(SpanPhaseName(task.phase)), " of layer ",
      task.layer, " of span ", task.span, " from what it keeps (forward done to layer ",
      forward_done, ", cotangent of layer ", g_layer, ")"));
}

template <typename T>
StoredRows<T> MakeSpanRows(size_t n, Storage storage, const std::string& spill_dir) {
  absl::StatusOr<StoredRows<T>> rows = StoredRows<T>::Create(n, storage, spill_dir);
  if (!rows.ok()) {
    std::fprintf(stderr, "adjsh: %s; keeping the rows in memory\n",
                 std::string(rows.status().message()).c_str());
    rows = StoredRows<T>::Create(n, storage, "");
  }
  return std::move(*rows);
}

template <typename T>
void AddNextSpanHalo(const std::vector<T>& du_halo, int64_t len, int64_t D, std::vector<T>& g) {
  const int64_t n = static_cast<int64_t>(du_halo.size()) / D;
  ADJSH_CHECK(n <= len, "du_halo longer than the span");
  T* rows = g.data() + (len - n) * D;
  for (int64_t q = 0; q < n * D; ++q) rows[q] += du_halo[q];
}

template <typename T>
SpanWork<T>::SpanWork(const BackendModel<T>& model, const SpanPlan& plan, int64_t span,
                      std::vector<uint32_t> tokens, std::vector<uint8_t> mask, int64_t n_targets,
                      Storage storage, std::string spill_dir)
    : model_(model),
      cfg_(model.params->config),
      plan_(plan),
      s_(span),
      r_(plan.range(span)),
      tokens_(std::move(tokens)),
      mask_(std::move(mask)),
      n_targets_(n_targets),
      D_(cfg_.hidden_size),
      DiN_(cfg_.inner() * cfg_.state_size),
      storage_(storage),
      spill_dir_(std::move(spill_dir)) {
  const int64_t K = cfg_.num_hidden_layers, rows = r_.halo + r_.len;
  ADJSH_CHECK(static_cast<int64_t>(tokens_.size()) >= rows, "span tokens too short");
  for (int64_t k = 0; k < K; ++k) {
    u_.push_back(MakeSpanRows<T>(rows * D_, storage_, spill_dir_));
    states_.push_back(MakeSpanRows<T>((r_.c1 - r_.c0) * DiN_, storage_, ""));
  }
  carried_.resize(K);
  for (auto& layer : carried_) layer.resize(r_.c1 - r_.c0);
  const std::vector<T>& E = model_.params->embed;
  for (int64_t t = 0; t < rows; ++t) u_[0].Commit(t * D_, D_, E.data() + int64_t{tokens_[t]} * D_);
}

template <typename T>
bool SpanWork<T>::Ready(const SpanTask& task) const {
  return SpanTaskReady(task, cfg_.num_hidden_layers, forward_done_, g_layer_);
}

template <typename T>
absl::Status SpanWork<T>::Run(const SpanTask& task, const SpanInputs<T>& in, SpanOutputs<T>& out) {
  if (task.span != s_ || !Ready(task)) return SpanNotReady(s_, task, forward_done_, g_layer_);
  switch (task.phase) {
    case SpanPhase::kForwardSummary: Forward(task.layer, in, out, true); break;
    case SpanPhase::kForward: Forward(task.layer, in, out, false); break;
    case SpanPhase::kBackwardSummary: Backward(task.layer, in, out, true); break;
    case SpanPhase::kBackward: Backward(task.layer, in, out, false); break;
  }
  return absl::OkStatus();
}

// Rows [0, H) of u^k: the previous span's last rows (layer 0 has them from the tokens).
template <typename T>
void SpanWork<T>::SetHalo(int64_t k, const SpanInputs<T>& in) {
  if (k == 0 || r_.halo == 0) return;
  ADJSH_CHECK(static_cast<int64_t>(in.halo_u.size()) == r_.halo * D_, "halo_u has the wrong size");
  u_[k].Commit(0, r_.halo * D_, in.halo_u.data());
}

template <typename T>
void SpanWork<T>::Forward(int64_t k, const SpanInputs<T>& in, SpanOutputs<T>& out, bool summary) {
  const int64_t K = cfg_.num_hidden_layers, Di = cfg_.inner(), N = cfg_.state_size;
  const int64_t base = r_.t0 - r_.halo;  // the token of u_[k]'s row 0
  BlockBackend<T>& block = *model_.blocks[k];
  const T* A = model_.A.data() + k * DiN_;
  SetHalo(k, in);
  thread_local std::vector<T> u_in, h_in, u_out, h_loc, S_c, next;
  if (summary) {  // from zero: h~ = P_c . h~ + h_local(c) and Sigma = sum of S_c, chunk by chunk
    out.h_end.assign(DiN_, T(0));
    out.sigma.assign(Di, T(0));
    h_loc.resize(DiN_), S_c.resize(Di), next.resize(DiN_);
    StartKeeping(SpanPhase::kForwardSummary, k);
    for (int64_t c = r_.c0; c < r_.c1; ++c) {
      const SpanRange ch = plan_.Chunk(c);
      const T* u = u_[k].Read((ch.t0 - ch.halo - base) * D_, (ch.halo + ch.len) * D_, u_in);
      kept_[c - r_.c0] =
          block.LocalSummaryKeep(u, {ch.halo, ch.len, 0}, h_loc.data(), S_c.data());
      DecayAdd(A, S_c.data(), out.h_end.data(), h_loc.data(), DiN_, N, next.data());
      std::swap(out.h_end, next);
      for (int64_t i = 0; i < Di; ++i) out.sigma[i] += S_c[i];
    }
    return;
  }
  // From the true start state; each chunk's start state is stored (rounded as the storage
  // rounds) and read back, so the forward goes on from exactly what the backward will read.
  const bool top = k + 1 == K;
  if (top) g_.assign(r_.len * D_, T(0));
  std::vector<T> h(DiN_, T(0));
  if (!in.h0.empty()) h = in.h0;
  for (int64_t c = r_.c0; c < r_.c1; ++c) {
    const SpanRange ch = plan_.Chunk(c);
    const int64_t i = c - r_.c0;
    states_[k].Commit(i * DiN_, DiN_, h.data());
    const T* h0 = states_[k].Read(i * DiN_, DiN_, h_in);
    const T* u = u_[k].Read((ch.t0 - ch.halo - base) * D_, (ch.halo + ch.len) * D_, u_in);
    const int64_t row = ch.t0 - base;  // the chunk's first own row in u_[k + 1]
    T* dst = top ? g_.data() + (ch.t0 - r_.t0) * D_
                 : u_[k + 1].WriteBuffer(row * D_, ch.len * D_, u_out);
    next.resize(DiN_);
    // Carried only while a layer's summaries, which may keep a set for every chunk of the
    // step at once (they run ahead of their passes: engine/span_plan.h), still find room; a
    // forward-only plan has no backward to carry it to (room_for < 0).
    carried_[k][i] =
        block.ForwardKept(TakeKept(SpanPhase::kForwardSummary, k, i), u, {ch.halo, ch.len, 0},
                          h0, dst, next.data(), plan_.forward_only() ? -1 : plan_.chunks());
    if (!top) u_[k + 1].Commit(row * D_, ch.len * D_, dst);
    h.swap(next);
  }
  kept_.clear();
  forward_done_ = std::max(forward_done_, k + 1);
  if (top) {
    Head(out);
    return;
  }
  const int64_t n = std::min(cfg_.conv_kernel - 1, r_.len);
  const T* last = u_[k + 1].Read((r_.halo + r_.len - n) * D_, n * D_, u_in);
  out.halo_next.assign(last, last + n * D_);
}

// The LM head over the span's rows: loss sum, dL/du^K into g, the head's partials kept (a
// forward-only plan: the loss sum alone).
std::vector<int64_t> SpanTargets(const SpanPlan& plan, const SpanRange& r,
                                 const std::vector<uint32_t>& tokens,
                                 const std::vector<uint8_t>& mask) {
  const int64_t T = plan.T(), base = r.t0 - r.halo;
  std::vector<int64_t> targets(r.len, -1);
  for (int64_t t = r.t0; t < r.t0 + r.len; ++t) {
    const int64_t next = t + 1 - base;  // position of token t + 1 in tokens
    if (t + 1 < T && (mask.empty() || mask[next] != 0)) targets[t - r.t0] = tokens[next];
  }
  return targets;
}

template <typename T, typename Layer>
void RunSpanHead(const SpanHeadArgs<T>& head, const SpanPlan& plan, const SpanRange& r,
                 const std::vector<uint32_t>& tokens, const std::vector<uint8_t>& mask,
                 int64_t n_targets, std::vector<T>& g, SpanOutputs<T, Layer>& out) {
  const std::vector<int64_t> targets = SpanTargets(plan, r, tokens, mask);
  int64_t correct = 0;
  cpu::LmHeadArgs<T> args{r.len,  head.D,   head.V,         head.eps,
                          head.E, head.norm_f, g.data(), targets.data(),
                          T(1) / T(n_targets)};
  if (!mask.empty()) args.correct = &correct;
  if (plan.forward_only()) {  // the loss alone (an evaluation): no dL/du, no partials
    out.loss_sum = head.backend->HeadLoss(args);
  } else {
    out.embed.assign(head.V * head.D, T(0));
    out.norm_f.assign(head.D, T(0));
    // The next g goes into the thread's spare buffer, and the old g becomes the spare: one
    // spare per thread, not per span (a fresh (len, D) buffer per task costs page faults).
    thread_local std::vector<T> du;
    du.resize(r.len * head.D);
    out.loss_sum =
        head.backend->HeadForwardBackward(args, du.data(), out.embed.data(), out.norm_f.data());
    std::swap(g, du);
  }
  out.correct = correct;
}

template <typename T>
void SpanWork<T>::Head(SpanOutputs<T>& out) {
  const SpanHeadArgs<T> head{model_.backend, model_.params->head().data(),
                             model_.params->norm_f.data(), cfg_.vocab_size, D_,
                             cfg_.layer_norm_epsilon};
  RunSpanHead(head, plan_, r_, tokens_, mask_, n_targets_, g_, out);
  g_layer_ = cfg_.num_hidden_layers;
  next_halo_added_ = true;  // nothing after the head feeds g
}

// Span s + 1's part of dL/du^{k+1} of the last rows, once per layer.
template <typename T>
void SpanWork<T>::AddNextHalo(const SpanInputs<T>& in) {
  if (next_halo_added_) return;
  next_halo_added_ = true;
  AddNextSpanHalo(in.du_halo, r_.len, D_, g_);
}

template <typename T>
void SpanWork<T>::Backward(int64_t k, const SpanInputs<T>& in, SpanOutputs<T>& out,
                           bool summary) {
  const int64_t Di = cfg_.inner(), N = cfg_.state_size;
  const int64_t base = r_.t0 - r_.halo;
  BlockBackend<T>& block = *model_.blocks[k];
  const T* A = model_.A.data() + k * DiN_;
  AddNextHalo(in);
  thread_local std::vector<T> u_in, h_in, m_c, S_c, next;
  if (summary) {  // out of chunk c backwards: m_c + P_c . (what flows into it), last chunk first
    out.m.assign(DiN_, T(0));
    m_c.resize(DiN_), S_c.resize(Di), next.resize(DiN_);
    StartKeeping(SpanPhase::kBackwardSummary, k);
    for (int64_t c = r_.c1 - 1; c >= r_.c0; --c) {
      const SpanRange ch = plan_.Chunk(c);
      const T* u = u_[k].Read((ch.t0 - ch.halo - base) * D_, (ch.halo + ch.len) * D_, u_in);
      kept_[c - r_.c0] = block.AdjointSummaryKeep(
          std::move(carried_[k][c - r_.c0]), u, {ch.halo, ch.len, 0},
          g_.data() + (ch.t0 - r_.t0) * D_, m_c.data(), S_c.data());
      DecayAdd(A, S_c.data(), out.m.data(), m_c.data(), DiN_, N, next.data());
      std::swap(out.m, next);
    }
    return;
  }
  // The chunks from the last: each one's dL/du^k rows, then the halo parts of later chunks
  // added in chunk order (as the rows' own chunk has written them); parts reaching before t0
  // become du_halo_prev.
  out.grad = ZeroLayer<T>(cfg_);
  thread_local std::vector<T> du;  // the thread's spare, as in Head (Backward writes every row)
  du.resize(r_.len * D_);
  std::vector<T> mu_next, mu_out(DiN_);
  out.du_halo_prev.assign(r_.halo * D_, T(0));
  std::vector<std::vector<T>> halos(r_.c1 - r_.c0);
  for (int64_t c = r_.c1 - 1; c >= r_.c0; --c) {
    const SpanRange ch = plan_.Chunk(c);
    const int64_t i = c - r_.c0;
    const T* u = u_[k].Read((ch.t0 - ch.halo - base) * D_, (ch.halo + ch.len) * D_, u_in);
    const T* h0 = states_[k].Read(i * DiN_, DiN_, h_in);
    const T* mu = c + 1 == r_.c1 ? (in.mu.empty() ? nullptr : in.mu.data()) : mu_next.data();
    halos[i].assign(ch.halo * D_, T(0));
    // What the summary kept, or else (span 0 runs none) what the forward carried.
    std::unique_ptr<KeptActs> set = TakeKept(SpanPhase::kBackwardSummary, k, i);
    if (!set) set = std::move(carried_[k][i]);
    block.BackwardKept(std::move(set), u, {ch.halo, ch.len, 0},
                       g_.data() + (ch.t0 - r_.t0) * D_, h0, mu, out.grad,
                       du.data() + (ch.t0 - r_.t0) * D_, halos[i].data(), mu_out.data());
    mu_next = mu_out;
    for (int64_t c2 = c + 1; c2 < r_.c1; ++c2) {
      const SpanRange ch2 = plan_.Chunk(c2);
      const int64_t first = ch2.t0 - ch2.halo;
      if (first >= ch.t0 + ch.len) break;
      const std::vector<T>& halo = halos[c2 - r_.c0];
      for (int64_t t = std::max(first, ch.t0); t < ch2.t0 && t < ch.t0 + ch.len; ++t)
        for (int64_t d = 0; d < D_; ++d)
          du[(t - r_.t0) * D_ + d] += halo[(t - first) * D_ + d];
    }
  }
  for (int64_t c = r_.c0; c < r_.c1; ++c) {  // the parts that reach into span s - 1
    const SpanRange ch = plan_.Chunk(c);
    const int64_t first = ch.t0 - ch.halo;
    if (first >= r_.t0) break;
    const std::vector<T>& halo = halos[c - r_.c0];
    for (int64_t t = first; t < r_.t0 && t < ch.t0; ++t)
      for (int64_t d = 0; d < D_; ++d)
        out.du_halo_prev[(t - base) * D_ + d] += halo[(t - first) * D_ + d];
  }
  kept_.clear();
  std::swap(g_, du);
  g_layer_ = k;
  next_halo_added_ = false;
  u_[k] = StoredRows<T>();
  states_[k] = StoredRows<T>();
  for (auto& set : carried_[k]) set.reset();
  if (k > 0) return;
  // The embedding lookup: dE[token_t] += dL/du^0_t in token order (span s + 1's halo part of
  // the last rows is added by the coordinator: it has those rows).
  out.embed.assign(cfg_.vocab_size * D_, T(0));
  for (int64_t t = 0; t < r_.len; ++t) {
    T* row = out.embed.data() + int64_t{tokens_[r_.halo + t]} * D_;
    for (int64_t d = 0; d < D_; ++d) row[d] += g_[t * D_ + d];
  }
}

template <typename T>
void SpanWork<T>::StartKeeping(SpanPhase phase, int64_t k) {
  kept_.clear();  // hands back what an earlier summary kept
  kept_.resize(r_.c1 - r_.c0);
  kept_phase_ = phase, kept_layer_ = k;
}

template <typename T>
std::unique_ptr<KeptActs> SpanWork<T>::TakeKept(SpanPhase phase, int64_t k, int64_t i) {
  if (kept_phase_ != phase || kept_layer_ != k || i >= static_cast<int64_t>(kept_.size()))
    return nullptr;
  return std::move(kept_[i]);
}

template <typename T>
int64_t SpanWork<T>::kept_bytes() const {
  int64_t b = static_cast<int64_t>(g_.size() * sizeof(T));
  for (const auto& u : u_) b += static_cast<int64_t>(u.bytes());
  for (const auto& s : states_) b += static_cast<int64_t>(s.bytes());
  return b;
}

template StoredRows<float> MakeSpanRows<float>(size_t, Storage, const std::string&);
template StoredRows<double> MakeSpanRows<double>(size_t, Storage, const std::string&);
template void AddNextSpanHalo<float>(const std::vector<float>&, int64_t, int64_t,
                                     std::vector<float>&);
template void AddNextSpanHalo<double>(const std::vector<double>&, int64_t, int64_t,
                                      std::vector<double>&);
#define ADJSH_SPAN_HEAD(T, Layer)                                                         \
  template void RunSpanHead<T, Layer>(const SpanHeadArgs<T>&, const SpanPlan&, const SpanRange&, \
                                      const std::vector<uint32_t>&, const std::vector<uint8_t>&,  \
                                      int64_t, std::vector<T>&, SpanOutputs<T, Layer>&);
ADJSH_SPAN_HEAD(float, LayerParams<float>)
ADJSH_SPAN_HEAD(double, LayerParams<double>)
ADJSH_SPAN_HEAD(float, Mamba2Layer<float>)
ADJSH_SPAN_HEAD(double, Mamba2Layer<double>)
#undef ADJSH_SPAN_HEAD
template struct BackendModel<float>;
template struct BackendModel<double>;
template class SpanWork<float>;
template class SpanWork<double>;

}  // namespace adjsh
