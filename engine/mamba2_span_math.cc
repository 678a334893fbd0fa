#include "engine/mamba2_span_math.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

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
Mamba2SpanMath<T>::Mamba2SpanMath(const Model& model, const SpanRows<T>&)
    : m_(model),
      cfg_(model.params->config),
      d_(model.params->config),
      HPN_(d_.H * d_.P * d_.N),
      start_(cfg_.num_hidden_layers) {}

template <typename T>
void Mamba2SpanMath<T>::ForwardSummary(SpanRows<T>& s, int64_t k, Outputs& out) {
  Mamba2ChunkOps<T>& ops = *m_.layers[k];
  Scratch<T>& sc = ThreadScratch<T>();
  out.h_end.assign(HPN_, T(0));
  std::vector<T> dt_sum(d_.H, T(0));
  for (int64_t c = s.r.c0; c < s.r.c1; ++c) {
    const SpanRange ch = s.plan.Chunk(c);
    ops.Forward(s.ChunkRows(k, c, sc.rows), ch.t0, ch.t0 + ch.len, out.h_end.data(), nullptr,
                dt_sum.data());
  }
  out.sigma.resize(d_.Di);  // each head's sum over its P channels (engine/families/mamba2.h)
  for (int64_t h = 0; h < d_.H; ++h) std::fill_n(out.sigma.begin() + h * d_.P, d_.P, dt_sum[h]);
}

template <typename T>
void Mamba2SpanMath<T>::Forward(SpanRows<T>& s, int64_t k, const std::vector<T>& h0, bool top) {
  const int64_t D = d_.D, base = s.base();
  Mamba2ChunkOps<T>& ops = *m_.layers[k];
  Scratch<T>& sc = ThreadScratch<T>();
  start_[k] = h0.empty() ? std::vector<T>(HPN_, T(0)) : h0;
  ADJSH_CHECK(static_cast<int64_t>(start_[k].size()) == HPN_, "h0 has the wrong size");
  sc.S = start_[k];
  for (int64_t c = s.r.c0; c < s.r.c1; ++c) {
    const SpanRange ch = s.plan.Chunk(c);
    const int64_t row = ch.t0 - base, n = ch.len * D;  // the chunk's own rows in u^{k+1}
    T* dst = top ? s.g.data() + (ch.t0 - s.r.t0) * D : s.u[k + 1].WriteBuffer(row * D, n, sc.out);
    ops.Forward(s.ChunkRows(k, c, sc.rows), ch.t0, ch.t0 + ch.len, sc.S.data(), dst, nullptr);
    const T* res = s.u[k].Read(row * D, n, sc.in);  // the residual: the stored (read) input
    for (int64_t i = 0; i < n; ++i) dst[i] += res[i];
    if (!top) s.u[k + 1].Commit(row * D, n, dst);
  }
}

template <typename T>
void Mamba2SpanMath<T>::ChunkStates(SpanRows<T>& s, int64_t k) {
  if (states_layer_ == k) return;
  Scratch<T>& sc = ThreadScratch<T>();
  chunk_states_.resize((s.r.c1 - s.r.c0) * HPN_);
  sc.S = start_[k];
  for (int64_t c = s.r.c0; c < s.r.c1; ++c) {
    const SpanRange ch = s.plan.Chunk(c);
    std::copy(sc.S.begin(), sc.S.end(), chunk_states_.begin() + (c - s.r.c0) * HPN_);
    m_.layers[k]->Forward(s.ChunkRows(k, c, sc.rows), ch.t0, ch.t0 + ch.len, sc.S.data(),
                          nullptr, nullptr);
  }
  states_layer_ = k;
}

template <typename T>
void Mamba2SpanMath<T>::BackwardSummary(SpanRows<T>& s, int64_t k, Outputs& out) {
  Mamba2ChunkOps<T>& ops = *m_.layers[k];
  ChunkStates(s, k);
  Scratch<T>& sc = ThreadScratch<T>();
  out.m.assign(HPN_, T(0));
  for (int64_t c = s.r.c1 - 1; c >= s.r.c0; --c) {
    const SpanRange ch = s.plan.Chunk(c);
    ops.Adjoint(s.ChunkRows(k, c, sc.rows), ch.t0, ch.t0 + ch.len,
                chunk_states_.data() + (c - s.r.c0) * HPN_, s.g.data() + (ch.t0 - s.r.t0) * d_.D,
                out.m.data());
  }
}

template <typename T>
void Mamba2SpanMath<T>::Backward(SpanRows<T>& s, int64_t k, const std::vector<T>& mu,
                                 Outputs& out, T* du) {
  const int64_t D = d_.D;
  Mamba2ChunkOps<T>& ops = *m_.layers[k];
  ChunkStates(s, k);
  Scratch<T>& sc = ThreadScratch<T>();
  for (const Mamba2LayerSlot<T>& slot : Mamba2LayerSlots<T>())
    (out.grad.*slot.member).assign(ShapeNumel(slot.shape(cfg_)), T(0));
  std::vector<T> carry = mu.empty() ? std::vector<T>(HPN_, T(0)) : mu;
  ADJSH_CHECK(static_cast<int64_t>(carry.size()) == HPN_, "mu has the wrong size");
  std::vector<T> halo((d_.W - 1) * d_.Cc, T(0));  // conv-input gradient of earlier rows
  for (int64_t c = s.r.c1 - 1; c >= s.r.c0; --c) {
    const SpanRange ch = s.plan.Chunk(c);
    const int64_t at = (ch.t0 - s.r.t0) * D;
    ops.Backward(s.ChunkRows(k, c, sc.rows), ch.t0, ch.t0 + ch.len,
                 chunk_states_.data() + (c - s.r.c0) * HPN_, s.g.data() + at, carry.data(),
                 halo.data(), out.grad, du + at);
  }
  out.du_halo_prev.assign(s.r.halo * D, T(0));
  if (s.r.halo > 0) {
    const T* hu = s.u[k].Read(0, s.r.halo * D, sc.in);
    ops.HaloBackward(hu, s.r.t0, halo.data(), out.grad, out.du_halo_prev.data());
  }
}

template <typename T>
void Mamba2SpanMath<T>::DropLayer(int64_t k) {
  start_[k] = std::vector<T>();
  states_layer_ = -1;
  if (k == 0) chunk_states_ = std::vector<T>();
}

template <typename T>
int64_t Mamba2SpanMath<T>::kept_bytes() const {
  int64_t b = static_cast<int64_t>(chunk_states_.size() * sizeof(T));
  for (const auto& s : start_) b += static_cast<int64_t>(s.size() * sizeof(T));
  return b;
}

template class Mamba2SpanMath<float>;
template class Mamba2SpanMath<double>;

}  // namespace adjsh
