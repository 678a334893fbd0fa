#include "engine/span_math.h"

#include <algorithm>
#include <utility>

#include "common/check.h"
#include "common/mamba2_model.h"
#include "common/model.h"

namespace adjsh {
namespace {

// Row and state buffers per thread, not per span: a step has many spans.
template <typename T>
struct Scratch {
  std::vector<T> rows, in, out, state;
};

template <typename T>
Scratch<T>& ThreadScratch() {
  thread_local Scratch<T> s;
  return s;
}

ChunkSpan Span(const SpanRange& ch) { return {ch.t0, ch.len, ch.halo}; }

}  // namespace

template <typename Params>
SpanMath<Params>::SpanMath(const Model& model, const SpanRows<T>& s)
    : model_(model),
      S_(model.layers.front()->state_size()),
      keeps_chunk_states_(model.layers.front()->keeps_chunk_states()),
      space_(*model.rows) {
  const int64_t K = static_cast<int64_t>(model.layers.size()), chunks = s.r.c1 - s.r.c0;
  if (keeps_chunk_states_) {
    for (int64_t k = 0; k < K; ++k)
      states_.push_back(MakeSpanRows<T>(chunks * S_, s.storage, "", space_));
  } else {
    start_.resize(K);
  }
  carried_.resize(K);
  for (auto& layer : carried_) layer.resize(chunks);
}

template <typename Params>
void SpanMath<Params>::ForwardSummary(SpanRows<T>& s, int64_t k, Outputs& out) {
  ChunkOps<T, Layer>& ops = *model_.layers[k];
  Scratch<T>& sc = ThreadScratch<T>();
  const int64_t n_sigma = ops.sigma_size();
  RowBuffer<T> state(space_, S_), sigma(space_, n_sigma);
  space_.Zero(state.data(), S_), space_.Zero(sigma.data(), n_sigma);
  StartKeeping(SpanPhase::kForwardSummary, k, s.r.c1 - s.r.c0);
  for (int64_t c = s.r.c0; c < s.r.c1; ++c) {
    kept_[c - s.r.c0] = ops.FoldForward(s.ChunkRows(k, c, sc.rows, c + 1),
                                        Span(s.plan.Chunk(c)), state.data(), sigma.data());
  }
  out.h_end.resize(S_), out.sigma.resize(n_sigma);
  space_.Download(out.h_end.data(), state.data(), S_);
  space_.Download(out.sigma.data(), sigma.data(), n_sigma);
}

template <typename Params>
void SpanMath<Params>::Forward(SpanRows<T>& s, int64_t k, const std::vector<T>& h0_in, bool top) {
  const int64_t D = s.D;
  ChunkOps<T, Layer>& ops = *model_.layers[k];
  Scratch<T>& sc = ThreadScratch<T>();
  ADJSH_CHECK(h0_in.empty() || static_cast<int64_t>(h0_in.size()) == S_, "h0 has the wrong size");
  RowBuffer<T> h(space_, S_), next(space_, S_);
  if (h0_in.empty()) {
    space_.Zero(h.data(), S_);
  } else {
    space_.Upload(h.data(), h0_in.data(), S_);
  }
  if (!keeps_chunk_states_) {
    start_[k] = RowBuffer<T>(space_, S_);
    space_.Copy(start_[k].data(), h.data(), S_);
  }
  // Carried only while a layer's summaries, which may keep a set for every chunk of the step at
  // once (they run ahead of their passes: engine/span_plan.h), still find room; a forward-only
  // plan has no backward to carry it to (room_for < 0).
  const int64_t room_for = s.plan.forward_only() ? -1 : s.plan.chunks();
  for (int64_t c = s.r.c0; c < s.r.c1; ++c) {
    const SpanRange ch = s.plan.Chunk(c);
    const int64_t i = c - s.r.c0, row = ch.t0 - s.base();  // the chunk's own rows in u^{k+1}
    const T* start = h.data();
    if (keeps_chunk_states_) {  // stored as the storage rounds, and read back
      states_[k].Commit(i * S_, S_, h.data());
      start = states_[k].Read(i * S_, S_, sc.state);
    }
    T* dst = top ? s.g.data() + (ch.t0 - s.r.t0) * D
                 : s.u[k + 1].WriteBuffer(row * D, ch.len * D, sc.out);
    carried_[k][i] = ops.Forward(TakeKept(SpanPhase::kForwardSummary, k, i),
                                 s.ChunkRows(k, c, sc.rows, c + 1), Span(ch), start, dst,
                                 next.data(), room_for);
    if (!top) s.u[k + 1].Commit(row * D, ch.len * D, dst);
    space_.Copy(h.data(), next.data(), S_);
  }
  kept_.clear();
}

template <typename Params>
const typename SpanMath<Params>::T* SpanMath<Params>::ChunkStart(SpanRows<T>& s, int64_t k,
                                                                 int64_t i,
                                                                 std::vector<T>& scratch) {
  if (keeps_chunk_states_) return states_[k].Read(i * S_, S_, scratch);
  if (rebuilt_layer_ != k) {  // a forward sweep from the layer's start state
    Scratch<T>& sc = ThreadScratch<T>();
    const size_t n = static_cast<size_t>((s.r.c1 - s.r.c0) * S_);
    if (rebuilt_.size() != n) rebuilt_ = RowBuffer<T>(space_, n);
    RowBuffer<T> next(space_, S_);
    space_.Copy(next.data(), start_[k].data(), S_);
    for (int64_t c = s.r.c0; c < s.r.c1; ++c) {
      space_.Copy(rebuilt_.data() + (c - s.r.c0) * S_, next.data(), S_);
      model_.layers[k]->Forward(nullptr, s.ChunkRows(k, c, sc.rows, c + 1),
                                Span(s.plan.Chunk(c)), next.data(), nullptr, next.data(), -1);
    }
    rebuilt_layer_ = k;
  }
  return rebuilt_.data() + i * S_;
}

template <typename Params>
void SpanMath<Params>::BackwardSummary(SpanRows<T>& s, int64_t k, Outputs& out) {
  ChunkOps<T, Layer>& ops = *model_.layers[k];
  Scratch<T>& sc = ThreadScratch<T>();
  RowBuffer<T> m(space_, S_);
  space_.Zero(m.data(), S_);
  StartKeeping(SpanPhase::kBackwardSummary, k, s.r.c1 - s.r.c0);
  for (int64_t c = s.r.c1 - 1; c >= s.r.c0; --c) {
    const SpanRange ch = s.plan.Chunk(c);
    const int64_t i = c - s.r.c0;
    const T* start = ChunkStart(s, k, i, sc.state);
    kept_[i] = ops.FoldAdjoint(std::move(carried_[k][i]), s.ChunkRows(k, c, sc.rows, c - 1),
                               Span(ch), start, s.g.data() + (ch.t0 - s.r.t0) * s.D, m.data());
  }
  out.m.resize(S_);
  space_.Download(out.m.data(), m.data(), S_);
}

template <typename Params>
void SpanMath<Params>::Backward(SpanRows<T>& s, int64_t k, const std::vector<T>& mu_in,
                                Outputs& out, T* du) {
  const int64_t D = s.D, base = s.base();
  const SpanRange& r = s.r;
  ChunkOps<T, Layer>& ops = *model_.layers[k];
  Scratch<T>& sc = ThreadScratch<T>();
  ADJSH_CHECK(mu_in.empty() || static_cast<int64_t>(mu_in.size()) == S_, "mu has the wrong size");
  const bool rows = ops.halo_grad() == HaloGrad::kRows;
  // A resident model's partial stays where the rows are (out.grad_sum), else comes to grad.
  const int64_t n_sum = ops.grad_size();
  RowBuffer<T> sum(space_, n_sum);
  if (n_sum > 0) {
    space_.Zero(sum.data(), n_sum);
  } else {
    out.grad = ops.ZeroLayer();
  }
  const int64_t n_carry = ops.conv_carry_size();
  // mu_in, then the adjoint out of each chunk into the one before (mu_out, then mu_next).
  RowBuffer<T> mu_first(space_, mu_in.empty() ? 0 : S_), mu_next(space_, S_),
      mu_out(space_, S_), conv_carry(space_, n_carry), du_halo_prev(space_, r.halo * D);
  if (!mu_in.empty()) space_.Upload(mu_first.data(), mu_in.data(), S_);
  space_.Zero(conv_carry.data(), n_carry);
  space_.Zero(du_halo_prev.data(), r.halo * D);
  std::vector<RowBuffer<T>> halos(rows ? r.c1 - r.c0 : 0);  // kRows: per chunk (halo, D)
  for (int64_t c = r.c1 - 1; c >= r.c0; --c) {
    const SpanRange ch = s.plan.Chunk(c);
    const int64_t i = c - r.c0;
    const T* start = ChunkStart(s, k, i, sc.state);
    const T* mu = c + 1 == r.c1 ? mu_first.data() : mu_next.data();
    if (rows) {
      halos[i] = RowBuffer<T>(space_, ch.halo * D);
      space_.Zero(halos[i].data(), ch.halo * D);
    }
    // What the summary kept, or else (span 0 runs none) what the forward carried.
    std::unique_ptr<KeptActs> set = TakeKept(SpanPhase::kBackwardSummary, k, i);
    if (!set) set = std::move(carried_[k][i]);
    ops.Backward(std::move(set), s.ChunkRows(k, c, sc.rows, c - 1), Span(ch), start,
                 s.g.data() + (ch.t0 - r.t0) * D, mu, mu_out.data(), conv_carry.data(), out.grad,
                 du + (ch.t0 - r.t0) * D, rows ? halos[i].data() : nullptr, sum.data());
    std::swap(mu_next, mu_out);
    if (!rows) continue;
    for (int64_t c2 = c + 1; c2 < r.c1; ++c2) {  // the halo parts of later chunks, in order
      const SpanRange ch2 = s.plan.Chunk(c2);
      const int64_t first = ch2.t0 - ch2.halo;
      if (first >= ch.t0 + ch.len) break;
      const int64_t t0 = std::max(first, ch.t0), t1 = std::min(ch2.t0, ch.t0 + ch.len);
      if (t1 > t0) {
        space_.Add(du + (t0 - r.t0) * D, halos[c2 - r.c0].data() + (t0 - first) * D,
                   (t1 - t0) * D);
      }
    }
  }
  if (rows) {
    for (int64_t c = r.c0; c < r.c1; ++c) {  // the parts that reach into span s - 1
      const SpanRange ch = s.plan.Chunk(c);
      const int64_t first = ch.t0 - ch.halo;
      if (first >= r.t0) break;
      const int64_t t1 = std::min(r.t0, ch.t0);
      if (t1 > first) {
        space_.Add(du_halo_prev.data() + (first - base) * D, halos[c - r.c0].data(),
                   (t1 - first) * D);
      }
    }
  } else if (r.halo > 0) {
    ops.HaloBackward(s.u[k].Read(0, r.halo * D, sc.in), r.t0, conv_carry.data(), out.grad,
                     du_halo_prev.data(), sum.data());
  }
  if (n_sum > 0) {
    out.grad_sum = std::move(sum);
  } else {
    ops.FinishBackward(out.grad);
  }
  out.du_halo_prev.resize(r.halo * D);
  space_.Download(out.du_halo_prev.data(), du_halo_prev.data(), r.halo * D);
  kept_.clear();
}

template <typename Params>
void SpanMath<Params>::DropLayer(int64_t k) {
  if (keeps_chunk_states_) {
    states_[k] = StoredRows<T>();
  } else {
    start_[k] = RowBuffer<T>();
    rebuilt_layer_ = -1;
    if (k == 0) rebuilt_ = RowBuffer<T>();
  }
  for (auto& set : carried_[k]) set.reset();
}

template <typename Params>
void SpanMath<Params>::StartKeeping(SpanPhase phase, int64_t k, int64_t chunks) {
  kept_.clear();  // hands back what an earlier summary kept
  kept_.resize(chunks);
  kept_phase_ = phase, kept_layer_ = k;
}

template <typename Params>
std::unique_ptr<KeptActs> SpanMath<Params>::TakeKept(SpanPhase phase, int64_t k, int64_t i) {
  if (kept_phase_ != phase || kept_layer_ != k || i >= static_cast<int64_t>(kept_.size()))
    return nullptr;
  return std::move(kept_[i]);
}

template <typename Params>
int64_t SpanMath<Params>::kept_bytes() const {
  int64_t b = static_cast<int64_t>(rebuilt_.size() * sizeof(T));
  for (const auto& s : states_) b += static_cast<int64_t>(s.bytes());
  for (const auto& s : start_) b += static_cast<int64_t>(s.size() * sizeof(T));
  return b;
}

template class SpanMath<ModelParams<float>>;
template class SpanMath<ModelParams<double>>;
template class SpanMath<Mamba2Params<float>>;
template class SpanMath<Mamba2Params<double>>;

}  // namespace adjsh
