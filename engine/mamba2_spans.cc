// The Mamba-2 span schedule (engine/mamba2_spans.h). Every span writes only its own rows, its
// own summaries and its own gradient partial; whatever reads across spans (the combines, the
// halo fix-ups, the partials' sum) runs on the calling thread in span order.
#include "engine/mamba2_spans.h"

#include <algorithm>
#include <cmath>

namespace adjsh {
namespace {

// The rows a chunk [t0, t1) reads of a stored layer input (T, D): from its conv halo on.
template <typename T>
const T* Rows(const StoredRows<T>& u, int64_t t0, int64_t t1, const Mamba2Dims& d,
              std::vector<T>& scratch) {
  const int64_t first = t0 - std::min(d.W - 1, t0);
  return u.Read(static_cast<size_t>(first * d.D), static_cast<size_t>((t1 - first) * d.D),
                scratch);
}

}  // namespace

template <typename T>
Mamba2SpanSchedule<T>::Mamba2SpanSchedule(const Mamba2Config& cfg, const SpanPlan& plan,
                                          ThreadPool& pool)
    : cfg_(cfg), d_(cfg), plan_(plan), pool_(pool), S_(plan.spans()),
      HPN_(d_.H * d_.P * d_.N),
      start_(cfg.num_hidden_layers * S_ * HPN_),
      lambda_(cfg.num_hidden_layers * S_ * d_.H),
      chunk_states_(plan.chunks() * HPN_) {}

template <typename T>
int64_t Mamba2SpanSchedule<T>::kept_values() const {
  return static_cast<int64_t>(start_.size() + lambda_.size() + chunk_states_.size());
}

template <typename T>
std::unique_ptr<typename Mamba2SpanSchedule<T>::Scratch> Mamba2SpanSchedule<T>::TakeScratch() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return std::make_unique<Scratch>();
  std::unique_ptr<Scratch> s = std::move(free_.back());
  free_.pop_back();
  return s;
}

template <typename T>
void Mamba2SpanSchedule<T>::GiveScratch(std::unique_ptr<Scratch> s) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(std::move(s));
}

template <typename T>
void Mamba2SpanSchedule<T>::SpanForward(const Mamba2Layer<T>& l, const StoredRows<T>& u,
                                        int64_t s, T* S, StoredRows<T>* out_rows, T* top,
                                        T* lambda, Scratch& sc) {
  const SpanRange& r = plan_.range(s);
  const bool write = out_rows != nullptr || top != nullptr;
  if (lambda) std::fill(lambda, lambda + d_.H, T(1));
  for (int64_t c = r.c0; c < r.c1; ++c) {
    const SpanRange ch = plan_.Chunk(c);
    const int64_t t0 = ch.t0, t1 = ch.t0 + ch.len;
    const size_t at = static_cast<size_t>(t0 * d_.D), n = static_cast<size_t>(ch.len * d_.D);
    T* out = nullptr;
    if (write) out = out_rows ? out_rows->WriteBuffer(at, n, sc.out) : top + at;
    Mamba2ChunkForward(l, cfg_, Rows(u, t0, t1, d_, sc.rows), t0, t1, S, sc.acts, out);
    if (write) {
      const T* in = u.Read(at, n, sc.in);  // the residual: the stored (read) input
      for (size_t i = 0; i < n; ++i) out[i] += in[i];
      if (out_rows) out_rows->Commit(at, n, out);
    }
    if (lambda) {  // the decays the scan applied, multiplied in token order
      for (int64_t h = 0; h < d_.H; ++h) {
        const T A = -std::exp(l.A_log[h]);
        for (int64_t i = 0; i < ch.len; ++i) lambda[h] *= std::exp(sc.acts.dt[i * d_.H + h] * A);
      }
    }
  }
}

template <typename T>
void Mamba2SpanSchedule<T>::Forward(int64_t k, const Mamba2Layer<T>& l, const StoredRows<T>& u,
                                    StoredRows<T>* out_rows, T* top) {
  const int64_t PN = d_.P * d_.N;
  T* start = &start_[k * S_ * HPN_];
  T* lambda = &lambda_[k * S_ * d_.H];
  std::vector<T> local((S_ - 1) * HPN_, T(0));
  pool_.ParallelFor(S_ - 1, [&](int64_t s) {  // the spans' local end states from zero
    std::unique_ptr<Scratch> sc = TakeScratch();
    SpanForward(l, u, s, &local[s * HPN_], nullptr, nullptr, &lambda[s * d_.H], *sc);
    GiveScratch(std::move(sc));
  });
  std::fill(start, start + HPN_, T(0));
  for (int64_t s = 0; s + 1 < S_; ++s)
    for (int64_t h = 0; h < d_.H; ++h)
      for (int64_t q = h * PN; q < (h + 1) * PN; ++q)
        start[(s + 1) * HPN_ + q] = lambda[s * d_.H + h] * start[s * HPN_ + q] +
                                    local[s * HPN_ + q];
  // Every span from its true start state; the last span's decays, which no local pass gave,
  // for the backward's combine.
  pool_.ParallelFor(S_, [&](int64_t s) {
    std::unique_ptr<Scratch> sc = TakeScratch();
    sc->S.assign(start + s * HPN_, start + (s + 1) * HPN_);
    T* last = s == S_ - 1 && S_ > 1 ? &lambda[s * d_.H] : nullptr;
    SpanForward(l, u, s, sc->S.data(), out_rows, top, last, *sc);
    GiveScratch(std::move(sc));
  });
}

template <typename T>
void Mamba2SpanSchedule<T>::Backward(int64_t k, const Mamba2Layer<T>& l, const StoredRows<T>& u,
                                     const T* dout, T* din, Mamba2Layer<T>& g) {
  const int64_t PN = d_.P * d_.N, H1 = d_.W - 1;
  const T* start = &start_[k * S_ * HPN_];
  const T* lambda = &lambda_[k * S_ * d_.H];
  std::vector<T> local(S_ * HPN_, T(0)), carry(S_ * HPN_, T(0)), halos(S_ * H1 * d_.Cc, T(0));
  pool_.ParallelFor(S_, [&](int64_t s) {
    std::unique_ptr<Scratch> sc = TakeScratch();
    const SpanRange& r = plan_.range(s);
    sc->S.assign(start + s * HPN_, start + (s + 1) * HPN_);
    for (int64_t c = r.c0; c < r.c1; ++c) {  // the states at the span's chunk starts
      const SpanRange ch = plan_.Chunk(c);
      std::copy(sc->S.begin(), sc->S.end(), chunk_states_.begin() + c * HPN_);
      Mamba2ChunkForward(l, cfg_, Rows(u, ch.t0, ch.t0 + ch.len, d_, sc->rows), ch.t0,
                         ch.t0 + ch.len, sc->S.data(), sc->acts, static_cast<T*>(nullptr));
    }
    if (s > 0) {  // the span's adjoint carry from zero, for the span before it
      for (int64_t c = r.c1 - 1; c >= r.c0; --c) {
        const SpanRange ch = plan_.Chunk(c);
        sc->S.assign(chunk_states_.begin() + c * HPN_, chunk_states_.begin() + (c + 1) * HPN_);
        sc->out.resize(ch.len * d_.D);
        Mamba2ChunkForward(l, cfg_, Rows(u, ch.t0, ch.t0 + ch.len, d_, sc->rows), ch.t0,
                           ch.t0 + ch.len, sc->S.data(), sc->acts, sc->out.data());
        Mamba2ChunkAdjoint(l, cfg_, sc->acts, dout + ch.t0 * d_.D, &local[s * HPN_]);
      }
    }
    GiveScratch(std::move(sc));
  });
  for (int64_t s = S_ - 2; s >= 0; --s)  // carry(s) = local(s + 1) + Lambda_{s+1} carry(s + 1)
    for (int64_t h = 0; h < d_.H; ++h)
      for (int64_t q = h * PN; q < (h + 1) * PN; ++q)
        carry[s * HPN_ + q] = local[(s + 1) * HPN_ + q] +
                              lambda[(s + 1) * d_.H + h] * carry[(s + 1) * HPN_ + q];
  // One span: straight into g, as the plain chunk-by-chunk pass. Else a zero partial per span.
  std::vector<Mamba2Layer<T>> partial(S_ > 1 ? S_ : 0);
  for (Mamba2Layer<T>& p : partial)
    for (const Mamba2LayerSlot<T>& slot : Mamba2LayerSlots<T>())
      (p.*slot.member).assign((l.*slot.member).size(), T(0));
  pool_.ParallelFor(S_, [&](int64_t s) {
    std::unique_ptr<Scratch> sc = TakeScratch();
    const SpanRange& r = plan_.range(s);
    Mamba2Layer<T>& gs = S_ > 1 ? partial[s] : g;
    for (int64_t c = r.c1 - 1; c >= r.c0; --c) {
      const SpanRange ch = plan_.Chunk(c);
      sc->S.assign(chunk_states_.begin() + c * HPN_, chunk_states_.begin() + (c + 1) * HPN_);
      sc->out.resize(ch.len * d_.D);
      const T* rows = Rows(u, ch.t0, ch.t0 + ch.len, d_, sc->rows);
      Mamba2ChunkForward(l, cfg_, rows, ch.t0, ch.t0 + ch.len, sc->S.data(), sc->acts,
                         sc->out.data());
      Mamba2ChunkBackward(l, cfg_, rows, sc->acts, dout + ch.t0 * d_.D, &carry[s * HPN_],
                          &halos[s * H1 * d_.Cc], gs, din + ch.t0 * d_.D);
    }
    GiveScratch(std::move(sc));
  });
  if (S_ == 1) return;
  std::vector<T> rows;
  for (int64_t s = 0; s + 1 < S_; ++s) {  // span s + 1's conv halo into span s's last rows
    const int64_t t0 = plan_.range(s + 1).t0, n = std::min(H1, t0);
    const T* u_rows = u.Read(static_cast<size_t>((t0 - n) * d_.D),
                             static_cast<size_t>(n * d_.D), rows);
    Mamba2HaloBackward(l, cfg_, u_rows, t0, &halos[(s + 1) * H1 * d_.Cc], partial[s],
                       din + (t0 - n) * d_.D);
  }
  for (const Mamba2Layer<T>& p : partial)  // the partials in span order
    for (const Mamba2LayerSlot<T>& slot : Mamba2LayerSlots<T>()) {
      std::vector<T>& dst = g.*slot.member;
      const std::vector<T>& src = p.*slot.member;
      for (size_t i = 0; i < dst.size(); ++i) dst[i] += src[i];
    }
}

template class Mamba2SpanSchedule<float>;
template class Mamba2SpanSchedule<double>;

}  // namespace adjsh
