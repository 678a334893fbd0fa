#include "engine/mamba2_span_work.h"

#include <algorithm>
#include <utility>

#include "common/check.h"
#include "kernels/cpu/lm_head.h"

namespace adjsh {
namespace {

// Row buffers per thread, not per span: a step has many spans.
template <typename T>
struct Scratch {
  std::vector<T> rows, in, out, S;
};

template <typename T>
Scratch<T>& ThreadScratch() {
  thread_local Scratch<T> s;
  return s;
}

}  // namespace

template <typename T>
Mamba2SpanWork<T>::Mamba2SpanWork(const Mamba2BackendModel<T>& model, const SpanPlan& plan,
                                  int64_t span, std::vector<uint32_t> tokens,
                                  std::vector<uint8_t> mask, int64_t n_targets, Storage storage,
                                  std::string spill_dir)
    : m_(model),
      p_(*model.params),
      cfg_(model.params->config),
      d_(model.params->config),
      plan_(plan),
      s_(span),
      r_(plan.range(span)),
      tokens_(std::move(tokens)),
      mask_(std::move(mask)),
      n_targets_(n_targets),
      HPN_(d_.H * d_.P * d_.N),
      storage_(storage),
      spill_dir_(std::move(spill_dir)) {
  const int64_t K = cfg_.num_hidden_layers, rows = r_.halo + r_.len;
  ADJSH_CHECK(static_cast<int64_t>(tokens_.size()) >= rows, "span tokens too short");
  for (int64_t k = 0; k < K; ++k) u_.push_back(MakeSpanRows<T>(rows * d_.D, storage_, spill_dir_));
  start_.resize(K);
  std::vector<T> scratch;
  for (int64_t t = 0; t < rows; ++t) {
    T* dst = u_[0].WriteBuffer(t * d_.D, d_.D, scratch);
    std::copy_n(p_.embed.begin() + int64_t{tokens_[t]} * d_.D, d_.D, dst);
    u_[0].Commit(t * d_.D, d_.D, dst);
  }
}

template <typename T>
bool Mamba2SpanWork<T>::Ready(const SpanTask& task) const {
  return SpanTaskReady(task, cfg_.num_hidden_layers, forward_done_, g_layer_);
}

template <typename T>
absl::Status Mamba2SpanWork<T>::Run(const SpanTask& task, const SpanInputs<T>& in,
                                    Mamba2SpanOutputs<T>& out) {
  if (task.span != s_ || !Ready(task)) return SpanNotReady(s_, task, forward_done_, g_layer_);
  switch (task.phase) {
    case SpanPhase::kForwardSummary: Forward(task.layer, in, out, true); break;
    case SpanPhase::kForward: Forward(task.layer, in, out, false); break;
    case SpanPhase::kBackwardSummary: Backward(task.layer, in, out, true); break;
    case SpanPhase::kBackward: Backward(task.layer, in, out, false); break;
  }
  return absl::OkStatus();
}

template <typename T>
const T* Mamba2SpanWork<T>::ChunkRows(int64_t k, int64_t c, std::vector<T>& scratch) const {
  const SpanRange ch = plan_.Chunk(c);
  const int64_t base = r_.t0 - r_.halo;  // the token of u_[k]'s row 0
  return u_[k].Read((ch.t0 - ch.halo - base) * d_.D, (ch.halo + ch.len) * d_.D, scratch);
}

template <typename T>
void Mamba2SpanWork<T>::Forward(int64_t k, const SpanInputs<T>& in, Mamba2SpanOutputs<T>& out,
                                bool summary) {
  const int64_t K = cfg_.num_hidden_layers, D = d_.D, base = r_.t0 - r_.halo;
  Mamba2ChunkOps<T>& ops = *m_.layers[k];
  Scratch<T>& sc = ThreadScratch<T>();
  if (k > 0 && r_.halo > 0) {  // rows [0, H) of u^k: the previous span's last rows
    ADJSH_CHECK(static_cast<int64_t>(in.halo_u.size()) == r_.halo * D,
                "halo_u has the wrong size");
    u_[k].Commit(0, r_.halo * D, in.halo_u.data());
  }
  if (summary) {  // from zero: the end state, and each head's dt summed over the span
    out.h_end.assign(HPN_, T(0));
    std::vector<T> dt_sum(d_.H, T(0));
    for (int64_t c = r_.c0; c < r_.c1; ++c) {
      const SpanRange ch = plan_.Chunk(c);
      ops.Forward(ChunkRows(k, c, sc.rows), ch.t0, ch.t0 + ch.len, out.h_end.data(), nullptr,
                  dt_sum.data());
    }
    out.sigma.resize(d_.Di);  // each head's sum over its P channels (engine/families/mamba2.h)
    for (int64_t h = 0; h < d_.H; ++h)
      std::fill_n(out.sigma.begin() + h * d_.P, d_.P, dt_sum[h]);
    return;
  }
  const bool top = k + 1 == K;
  if (top) g_.assign(r_.len * D, T(0));
  start_[k] = in.h0.empty() ? std::vector<T>(HPN_, T(0)) : in.h0;
  ADJSH_CHECK(static_cast<int64_t>(start_[k].size()) == HPN_, "h0 has the wrong size");
  sc.S = start_[k];
  for (int64_t c = r_.c0; c < r_.c1; ++c) {
    const SpanRange ch = plan_.Chunk(c);
    const int64_t row = ch.t0 - base, n = ch.len * D;  // the chunk's own rows in u^{k+1}
    T* dst = top ? g_.data() + (ch.t0 - r_.t0) * D : u_[k + 1].WriteBuffer(row * D, n, sc.out);
    ops.Forward(ChunkRows(k, c, sc.rows), ch.t0, ch.t0 + ch.len, sc.S.data(), dst, nullptr);
    const T* res = u_[k].Read(row * D, n, sc.in);  // the residual: the stored (read) input
    for (int64_t i = 0; i < n; ++i) dst[i] += res[i];
    if (!top) u_[k + 1].Commit(row * D, n, dst);
  }
  forward_done_ = std::max(forward_done_, k + 1);
  if (top) {
    Head(out);
    return;
  }
  const int64_t n = std::min(d_.W - 1, r_.len);
  const T* last = u_[k + 1].Read((r_.halo + r_.len - n) * D, n * D, sc.in);
  out.halo_next.assign(last, last + n * D);
}

// The LM head over the span's rows (engine/span_work.h RunSpanHead).
template <typename T>
void Mamba2SpanWork<T>::Head(Mamba2SpanOutputs<T>& out) {
  const SpanHeadArgs<T> head{m_.backend, p_.head().data(), p_.norm_f.data(), cfg_.vocab_size,
                             d_.D, cfg_.layer_norm_epsilon};
  RunSpanHead(head, plan_, r_, tokens_, mask_, n_targets_, g_, out);
  g_layer_ = cfg_.num_hidden_layers;
  next_halo_added_ = true;  // nothing after the head feeds g
}

// Span s + 1's part of dL/du^{k+1} of the last rows, once per layer.
template <typename T>
void Mamba2SpanWork<T>::AddNextHalo(const SpanInputs<T>& in) {
  if (next_halo_added_) return;
  next_halo_added_ = true;
  AddNextSpanHalo(in.du_halo, r_.len, d_.D, g_);
}

template <typename T>
void Mamba2SpanWork<T>::ChunkStates(int64_t k) {
  if (states_layer_ == k) return;
  Scratch<T>& sc = ThreadScratch<T>();
  chunk_states_.resize((r_.c1 - r_.c0) * HPN_);
  sc.S = start_[k];
  for (int64_t c = r_.c0; c < r_.c1; ++c) {
    const SpanRange ch = plan_.Chunk(c);
    std::copy(sc.S.begin(), sc.S.end(), chunk_states_.begin() + (c - r_.c0) * HPN_);
    m_.layers[k]->Forward(ChunkRows(k, c, sc.rows), ch.t0, ch.t0 + ch.len, sc.S.data(), nullptr,
                          nullptr);
  }
  states_layer_ = k;
}

template <typename T>
void Mamba2SpanWork<T>::Backward(int64_t k, const SpanInputs<T>& in, Mamba2SpanOutputs<T>& out,
                                 bool summary) {
  const int64_t D = d_.D;
  Mamba2ChunkOps<T>& ops = *m_.layers[k];
  AddNextHalo(in);
  ChunkStates(k);
  Scratch<T>& sc = ThreadScratch<T>();
  auto state = [&](int64_t c) { return chunk_states_.data() + (c - r_.c0) * HPN_; };
  if (summary) {  // the adjoint carry out of the span from zero, last chunk first
    out.m.assign(HPN_, T(0));
    for (int64_t c = r_.c1 - 1; c >= r_.c0; --c) {
      const SpanRange ch = plan_.Chunk(c);
      ops.Adjoint(ChunkRows(k, c, sc.rows), ch.t0, ch.t0 + ch.len, state(c),
                  g_.data() + (ch.t0 - r_.t0) * D, out.m.data());
    }
    return;
  }
  for (const Mamba2LayerSlot<T>& slot : Mamba2LayerSlots<T>())
    (out.grad.*slot.member).assign(ShapeNumel(slot.shape(cfg_)), T(0));
  std::vector<T> carry = in.mu.empty() ? std::vector<T>(HPN_, T(0)) : in.mu;
  ADJSH_CHECK(static_cast<int64_t>(carry.size()) == HPN_, "mu has the wrong size");
  std::vector<T> halo((d_.W - 1) * d_.Cc, T(0));  // conv-input gradient of earlier rows
  thread_local std::vector<T> du;  // the thread's spare (len, D), swapped with g as SpanWork's
  du.resize(r_.len * D);
  for (int64_t c = r_.c1 - 1; c >= r_.c0; --c) {
    const SpanRange ch = plan_.Chunk(c);
    const int64_t at = (ch.t0 - r_.t0) * D;
    ops.Backward(ChunkRows(k, c, sc.rows), ch.t0, ch.t0 + ch.len, state(c), g_.data() + at,
                 carry.data(), halo.data(), out.grad, du.data() + at);
  }
  // The conv halo's gradient, rows [t0 - H, t0) of span s - 1, through their in_proj and
  // pre-norm: dL/du^k of those rows, for span s - 1.
  out.du_halo_prev.assign(r_.halo * D, T(0));
  if (r_.halo > 0) {
    const T* hu = u_[k].Read(0, r_.halo * D, sc.in);
    ops.HaloBackward(hu, r_.t0, halo.data(), out.grad, out.du_halo_prev.data());
  }
  std::swap(g_, du);
  g_layer_ = k;
  next_halo_added_ = false;
  u_[k] = StoredRows<T>();
  start_[k] = std::vector<T>();
  states_layer_ = -1;
  if (k > 0) return;
  chunk_states_ = std::vector<T>();
  // The embedding lookup: dE[token_t] += dL/du^0_t in token order (span s + 1's halo part of
  // the last rows is added by the ledger).
  out.embed.assign(cfg_.vocab_size * D, T(0));
  for (int64_t t = 0; t < r_.len; ++t) {
    T* row = out.embed.data() + int64_t{tokens_[r_.halo + t]} * D;
    for (int64_t q = 0; q < D; ++q) row[q] += g_[t * D + q];
  }
}

template <typename T>
int64_t Mamba2SpanWork<T>::kept_bytes() const {
  int64_t b = static_cast<int64_t>((g_.size() + chunk_states_.size()) * sizeof(T));
  for (const auto& u : u_) b += static_cast<int64_t>(u.bytes());
  for (const auto& s : start_) b += static_cast<int64_t>(s.size() * sizeof(T));
  return b;
}

template class Mamba2SpanWork<float>;
template class Mamba2SpanWork<double>;

}  // namespace adjsh
