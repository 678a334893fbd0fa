#include "engine/mamba_span_math.h"

#include <algorithm>
#include <utility>

#include "common/check.h"
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

template <typename T>
MambaSpanMath<T>::MambaSpanMath(const Model& model, const SpanRows<T>& s)
    : model_(model), cfg_(model.params->config), DiN_(cfg_.inner() * cfg_.state_size) {
  const int64_t K = cfg_.num_hidden_layers, chunks = s.r.c1 - s.r.c0;
  for (int64_t k = 0; k < K; ++k) states_.push_back(MakeSpanRows<T>(chunks * DiN_, s.storage, ""));
  carried_.resize(K);
  for (auto& layer : carried_) layer.resize(chunks);
}

template <typename T>
void MambaSpanMath<T>::ForwardSummary(SpanRows<T>& s, int64_t k, Outputs& out) {
  const int64_t Di = cfg_.inner(), N = cfg_.state_size;
  BlockBackend<T>& block = *model_.blocks[k];
  const T* A = model_.A.data() + k * DiN_;
  thread_local std::vector<T> u_in, h_loc, S_c, next;
  out.h_end.assign(DiN_, T(0));
  out.sigma.assign(Di, T(0));
  h_loc.resize(DiN_), S_c.resize(Di), next.resize(DiN_);
  StartKeeping(SpanPhase::kForwardSummary, k, s.r.c1 - s.r.c0);
  for (int64_t c = s.r.c0; c < s.r.c1; ++c) {
    const SpanRange ch = s.plan.Chunk(c);
    const T* u = s.ChunkRows(k, c, u_in);
    kept_[c - s.r.c0] = block.LocalSummaryKeep(u, {ch.halo, ch.len, 0}, h_loc.data(), S_c.data());
    DecayAdd(A, S_c.data(), out.h_end.data(), h_loc.data(), DiN_, N, next.data());
    std::swap(out.h_end, next);
    for (int64_t i = 0; i < Di; ++i) out.sigma[i] += S_c[i];
  }
}

template <typename T>
void MambaSpanMath<T>::Forward(SpanRows<T>& s, int64_t k, const std::vector<T>& h0_in, bool top) {
  const int64_t D = s.D;
  BlockBackend<T>& block = *model_.blocks[k];
  thread_local std::vector<T> u_in, h_in, u_out, next;
  std::vector<T> h(DiN_, T(0));
  if (!h0_in.empty()) h = h0_in;
  for (int64_t c = s.r.c0; c < s.r.c1; ++c) {
    const SpanRange ch = s.plan.Chunk(c);
    const int64_t i = c - s.r.c0;
    states_[k].Commit(i * DiN_, DiN_, h.data());
    const T* h0 = states_[k].Read(i * DiN_, DiN_, h_in);
    const T* u = s.ChunkRows(k, c, u_in);
    const int64_t row = ch.t0 - s.base();  // the chunk's first own row in u[k + 1]
    T* dst = top ? s.g.data() + (ch.t0 - s.r.t0) * D
                 : s.u[k + 1].WriteBuffer(row * D, ch.len * D, u_out);
    next.resize(DiN_);
    // Carried only while a layer's summaries, which may keep a set for every chunk of the
    // step at once (they run ahead of their passes: engine/span_plan.h), still find room; a
    // forward-only plan has no backward to carry it to (room_for < 0).
    carried_[k][i] =
        block.ForwardKept(TakeKept(SpanPhase::kForwardSummary, k, i), u, {ch.halo, ch.len, 0},
                          h0, dst, next.data(), s.plan.forward_only() ? -1 : s.plan.chunks());
    if (!top) s.u[k + 1].Commit(row * D, ch.len * D, dst);
    h.swap(next);
  }
  kept_.clear();
}

template <typename T>
void MambaSpanMath<T>::BackwardSummary(SpanRows<T>& s, int64_t k, Outputs& out) {
  const int64_t Di = cfg_.inner(), N = cfg_.state_size;
  BlockBackend<T>& block = *model_.blocks[k];
  const T* A = model_.A.data() + k * DiN_;
  thread_local std::vector<T> u_in, m_c, S_c, next;
  out.m.assign(DiN_, T(0));
  m_c.resize(DiN_), S_c.resize(Di), next.resize(DiN_);
  StartKeeping(SpanPhase::kBackwardSummary, k, s.r.c1 - s.r.c0);
  for (int64_t c = s.r.c1 - 1; c >= s.r.c0; --c) {
    const SpanRange ch = s.plan.Chunk(c);
    const T* u = s.ChunkRows(k, c, u_in);
    kept_[c - s.r.c0] = block.AdjointSummaryKeep(
        std::move(carried_[k][c - s.r.c0]), u, {ch.halo, ch.len, 0},
        s.g.data() + (ch.t0 - s.r.t0) * s.D, m_c.data(), S_c.data());
    DecayAdd(A, S_c.data(), out.m.data(), m_c.data(), DiN_, N, next.data());
    std::swap(out.m, next);
  }
}

template <typename T>
void MambaSpanMath<T>::Backward(SpanRows<T>& s, int64_t k, const std::vector<T>& mu_in,
                                Outputs& out, T* du) {
  const int64_t D = s.D, base = s.base();
  const SpanRange& r = s.r;
  BlockBackend<T>& block = *model_.blocks[k];
  thread_local std::vector<T> u_in, h_in;
  out.grad = ZeroLayer<T>(cfg_);
  std::vector<T> mu_next, mu_out(DiN_);
  out.du_halo_prev.assign(r.halo * D, T(0));
  std::vector<std::vector<T>> halos(r.c1 - r.c0);
  for (int64_t c = r.c1 - 1; c >= r.c0; --c) {
    const SpanRange ch = s.plan.Chunk(c);
    const int64_t i = c - r.c0;
    const T* u = s.ChunkRows(k, c, u_in);
    const T* h0 = states_[k].Read(i * DiN_, DiN_, h_in);
    const T* mu = c + 1 == r.c1 ? (mu_in.empty() ? nullptr : mu_in.data()) : mu_next.data();
    halos[i].assign(ch.halo * D, T(0));
    // What the summary kept, or else (span 0 runs none) what the forward carried.
    std::unique_ptr<KeptActs> set = TakeKept(SpanPhase::kBackwardSummary, k, i);
    if (!set) set = std::move(carried_[k][i]);
    block.BackwardKept(std::move(set), u, {ch.halo, ch.len, 0},
                       s.g.data() + (ch.t0 - r.t0) * D, h0, mu, out.grad,
                       du + (ch.t0 - r.t0) * D, halos[i].data(), mu_out.data());
    mu_next = mu_out;
    for (int64_t c2 = c + 1; c2 < r.c1; ++c2) {
      const SpanRange ch2 = s.plan.Chunk(c2);
      const int64_t first = ch2.t0 - ch2.halo;
      if (first >= ch.t0 + ch.len) break;
      const std::vector<T>& halo = halos[c2 - r.c0];
      for (int64_t t = std::max(first, ch.t0); t < ch2.t0 && t < ch.t0 + ch.len; ++t)
        for (int64_t d = 0; d < D; ++d)
          du[(t - r.t0) * D + d] += halo[(t - first) * D + d];
    }
  }
  for (int64_t c = r.c0; c < r.c1; ++c) {  // the parts that reach into span s - 1
    const SpanRange ch = s.plan.Chunk(c);
    const int64_t first = ch.t0 - ch.halo;
    if (first >= r.t0) break;
    const std::vector<T>& halo = halos[c - r.c0];
    for (int64_t t = first; t < r.t0 && t < ch.t0; ++t)
      for (int64_t d = 0; d < D; ++d)
        out.du_halo_prev[(t - base) * D + d] += halo[(t - first) * D + d];
  }
  kept_.clear();
}

template <typename T>
void MambaSpanMath<T>::DropLayer(int64_t k) {
  states_[k] = StoredRows<T>();
  for (auto& set : carried_[k]) set.reset();
}

template <typename T>
void MambaSpanMath<T>::StartKeeping(SpanPhase phase, int64_t k, int64_t chunks) {
  kept_.clear();  // hands back what an earlier summary kept
  kept_.resize(chunks);
  kept_phase_ = phase, kept_layer_ = k;
}

template <typename T>
std::unique_ptr<KeptActs> MambaSpanMath<T>::TakeKept(SpanPhase phase, int64_t k, int64_t i) {
  if (kept_phase_ != phase || kept_layer_ != k || i >= static_cast<int64_t>(kept_.size()))
    return nullptr;
  return std::move(kept_[i]);
}

template <typename T>
int64_t MambaSpanMath<T>::kept_bytes() const {
  int64_t b = 0;
  for (const auto& s : states_) b += static_cast<int64_t>(s.bytes());
  return b;
}

template struct BackendModel<float>;
template struct BackendModel<double>;
template class MambaSpanMath<float>;
template class MambaSpanMath<double>;

}  // namespace adjsh
