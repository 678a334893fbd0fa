// The Mamba block's chunk forward and its token-local chain rule on the CPU. Products with the
// weights go through kernels/cpu/gemm_packed.h (OpenBLAS in f64); the scan and its adjoint
// live in scan_block.cc (and scan.cc).
#include "kernels/cpu/mamba_block.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common/check.h"
#include "kernels/cpu/aligned.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/kept_pool.h"
#include "kernels/cpu/kept_spares.h"
#include "kernels/cpu/math.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/scan_block.h"
#include "kernels/cpu/scratch.h"

namespace adjsh::cpu {

// Activations recomputed for P = halo + M rows (M = len + ahead). Row p of the P-indexed
// arrays is token first - halo + p; row t of the M-indexed arrays is token first + t.
template <typename T>
struct MambaBlockCpu<T>::Acts {
  int64_t halo = 0, M = 0;
  AlignedVector<T> r;      // (P) RMSNorm reciprocal rms
  AlignedVector<T> n;      // (P, D) normalised input
  AlignedVector<T> xz;     // (P, 2 Di) in_proj output: x = [:, :Di], z = [:, Di:]
  AlignedVector<T> cpre;   // (M, Di) conv output before silu
  AlignedVector<T> xc;     // (M, Di) x' = silu(cpre)
  AlignedVector<T> dbc;    // (M, R + 2N) x_proj output: [d | B | C]
  AlignedVector<T> dtpre;  // (M, Di) dt_proj output before softplus
  AlignedVector<T> dt;     // (M, Di) Delta

  ScanInputs<T> Scan(int64_t Di, int64_t N, int64_t R, const T* A) const {
    ScanInputs<T> in;
    in.M = M, in.Di = Di, in.N = N;
    in.dt = dt.data(), in.xc = xc.data();
    in.B = dbc.data() + R, in.C = dbc.data() + R + N, in.bc_stride = R + 2 * N;
    in.A = A;
    return in;
  }
};

// A summary's activations for the next pass on the same rows (mamba_block.h). stage says which
// summary filled it; a pass takes it only for the rows it was made for.
template <typename T>
struct MambaBlockCpu<T>::Kept {
  // kForward: LocalSummary's, for Forward; kCarried: all of Forward's, for AdjointSummary;
  // kBackward: AdjointSummary's (or the carried set it took), for Backward.
  enum class Stage { kEmpty, kForward, kCarried, kBackward };
  Stage stage = Stage::kEmpty;
  // The pool it came from and its store's spares (MakeSet): where it goes back, and counts.
  KeptPool<Kept>* pool = nullptr;
  Spares* spares = nullptr;
  int64_t carried = 0;  // bytes counted by its store's TryCarry while kCarried (CarriedBytes)
  // kBackward from a carried set AdjointSummary took: n and x' are still to be
  // refilled (FinishRefill), by Backward, which reads them, not by the summary, which does not.
  bool refill_pending = false;
  ChunkRows rows;
  Acts a;
  AlignedVector<T> d_o;  // kBackward: (len, Di) dL/do = g W_out

  int64_t bytes() const {
    size_t n = a.r.capacity() + a.n.capacity() + a.xz.capacity() + a.cpre.capacity() +
               a.xc.capacity() + a.dbc.capacity() + a.dtpre.capacity() + a.dt.capacity() +
               d_o.capacity();
    return static_cast<int64_t>(n * sizeof(T));
  }
  // The arrays a set gives up while carried or handed back (kernels/cpu/kept_spares.h): what
  // TakeCarried refills exactly from the rest (n, x', Delta) and the backward's own (dL/do);
  // CarriedBytes is what stays.
  typename Spares::Roles SpareRoles() { return {&a.n, &a.xc, &a.dt, &d_o}; }
  void GiveUpSpares() { spares->Put(SpareRoles()); }
  // A set in use (from the pool) down to its carried arrays, counted as that much.
  void ShedSpares() {
    pool->Recount(this, CarriedBytes());
    GiveUpSpares();
  }
  void TakeSpares() { spares->Take(SpareRoles()); }
  KeptStore& store() const { return pool->store(); }
  void SwapSpares(Kept& other) {
    const typename Spares::Roles mine = SpareRoles(), theirs = other.SpareRoles();
    for (size_t r = 0; r < mine.size(); ++r) mine[r]->swap(*theirs[r]);
  }
  int64_t CarriedBytes() const {
    size_t n = a.r.capacity() + a.xz.capacity() + a.cpre.capacity() + a.dbc.capacity() +
               a.dtpre.capacity();
    return static_cast<int64_t>(n * sizeof(T));
  }
  // Whether it holds `stage`'s activations of `r`.
  bool Holds(Stage want, ChunkRows r) const {
    return stage == want && rows.halo == r.halo && rows.len == r.len && rows.ahead == r.ahead;
  }
};

template <typename T>
void MambaBlockCpu<T>::KeptReturn::operator()(Kept* k) const {
  if (k == nullptr) return;
  if (k->carried > 0) k->store().EndCarry(k->carried), k->carried = 0;
  k->stage = Kept::Stage::kEmpty;
  k->refill_pending = false;
  // Back to the pool as a carried set's arrays; the others wait among the spares.
  k->ShedSpares();
  k->pool->Give(k);
}

template <typename T>
int64_t MambaBlockCpu<T>::CarriedSetBytes(ChunkRows rows) const {
  // What Kept::CarriedBytes counts once the set is filled: per row of u r and x|z, per own row
  // the conv output, d|B|C and dt_proj's pre-activation.
  const int64_t P = rows.halo + rows.len, M = rows.len;
  return (P * (1 + 2 * Di_) + M * (2 * Di_ + R_ + 2 * N_)) * static_cast<int64_t>(sizeof(T));
}

template <typename T>
int64_t MambaBlockCpu<T>::SetBytes(ChunkRows rows) const {
  // The backward's set, the larger: the carried arrays and the spares (Kept::SpareRoles): n per
  // row of u, x', Delta and dL/do per own row.
  const int64_t P = rows.halo + rows.len, M = rows.len;
  return CarriedSetBytes(rows) + (P * D_ + 3 * M * Di_) * static_cast<int64_t>(sizeof(T));
}

template <typename T>
typename MambaBlockCpu<T>::KeptPtr MambaBlockCpu<T>::MakeKept(ChunkRows rows) const {
  return MakeSet(rows, /*summary=*/true);
}

template <typename T>
typename MambaBlockCpu<T>::KeptPtr MambaBlockCpu<T>::MakeSet(ChunkRows rows,
                                                             bool summary) const {
  if (pool_ == nullptr) return KeptPtr();  // no store: nothing kept
  // The spares first, uncounted, so that the pool's count of a whole set finds their room.
  Kept spares;
  spares.spares = spares_;
  spares.TakeSpares();
  KeptPtr set(pool_->Take(SetBytes(rows), summary));  // counted as a whole set
  if (set) {
    set->pool = pool_, set->spares = spares_;
    set->SwapSpares(spares);  // a set from the pool holds none of these
  }
  spares.GiveUpSpares();  // what is left: back among the spares
  return set;
}

template <typename T>
typename MambaBlockCpu<T>::KeptPtr MambaBlockCpu<T>::MakeKeptToCarry(ChunkRows rows,
                                                                     int64_t room_for) const {
  if (room_for < 0 || kept_ == nullptr ||
      !kept_->CarryFits(CarriedSetBytes(rows), room_for * SetBytes(rows)))
    return KeptPtr();
  return MakeSet(rows, /*summary=*/false);  // not a summary's take (KeptTakes)
}

template <typename T>
bool MambaBlockCpu<T>::Carries(const Kept* kept, ChunkRows rows) const {
  return kept != nullptr && kept->Holds(Kept::Stage::kCarried, rows);
}

template <typename T>
bool MambaBlockCpu<T>::ReadyForBackward(const Kept* kept, ChunkRows rows) const {
  return kept != nullptr && kept->Holds(Kept::Stage::kBackward, rows);
}

template <typename T>
MambaBlockCpu<T>::MambaBlockCpu(const MambaConfig& config, const LayerParams<T>& params,
                                KeptStore* kept)
    : cfg_(config),
      p_(params),
      kept_(kept),
      D_(config.hidden_size),
      Di_(config.inner()),
      N_(config.state_size),
      R_(config.time_step_rank),
      W_(config.conv_kernel),
      in_x_(params.in_proj.data(), Trans::kYes, Di_, D_),
      in_z_(params.in_proj.data() + Di_ * D_, Trans::kYes, Di_, D_),
      x_proj_(params.x_proj.data(), Trans::kYes, R_ + 2 * N_, Di_),
      dt_proj_(params.dt_w.data(), Trans::kYes, Di_, R_),
      out_proj_(params.out_proj.data(), Trans::kYes, D_, Di_),
      in_back_(params.in_proj.data(), Trans::kNo, D_, 2 * Di_),
      out_back_(params.out_proj.data(), Trans::kNo, Di_, D_),
      dt_back_(params.dt_w.data(), Trans::kNo, R_, Di_),
      x_back_(params.x_proj.data(), Trans::kNo, Di_, R_ + 2 * N_) {
  A_.resize(Di_ * N_);
  for (int64_t k = 0; k < Di_ * N_; ++k) A_[k] = -std::exp(p_.A_log[k]);
  conv_t_.resize(W_ * Di_);
  for (int64_t i = 0; i < Di_; ++i)
    for (int64_t j = 0; j < W_; ++j) conv_t_[j * Di_ + i] = p_.conv_w[i * W_ + j];
  if (kept_ != nullptr) {  // the spares first: the order a set's take first reaches them
    spares_ = &kept_->CacheOf<Spares>();
    pool_ = &kept_->Pool<Kept>();
  }
}

namespace {

// softplus'(x) = sigmoid(x) of dt_proj's pre-activation x (bias added), for Backward. In f32
// from e = exp(-|x|), the exp math.h's Softplus takes the log of: (x >= 0 ? 1 : e) / (1 + e),
// which for x >= 0 is Sigmoid's own 1 / (1 + exp(-x)) and for x < 0 its rounding-level equal.
// f64 keeps Sigmoid as it is (the check mode is as exact as libm).
template <typename T>
inline T SoftplusGrad(T x) {
  if constexpr (std::is_same_v<T, float>) {
    const float e = ExpFast(x < 0.0f ? x : -x);
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
  } else {
    return Sigmoid(x);
  }
}

// One row of the causal depthwise conv and its silu: c = b + sum_j w[:, j] x_{t - W + 1 + j}
// (taps before the sequence are absent: xs[j] == nullptr) and x' = silu(c). Each c sums in tap
// order with a separate multiply and add, as the plain loop over taps did; with W = 4 and every
// tap present (every row but the sequence's first three) the taps stay in registers for the
// whole row instead of c being re-read per tap.
template <typename T>
void ConvSiluRow(const T* const* xs, const T* w_t, const T* b, int64_t W, int64_t Di, T* c,
                 T* xc) {
  if (W == 4 && xs[0] && xs[1] && xs[2] && xs[3]) {
    const T *x0 = xs[0], *x1 = xs[1], *x2 = xs[2], *x3 = xs[3];
    const T *w0 = w_t, *w1 = w_t + Di, *w2 = w_t + 2 * Di, *w3 = w_t + 3 * Di;
    for (int64_t i = 0; i < Di; ++i) {
      T v = b[i];
      v += w0[i] * x0[i];
      v += w1[i] * x1[i];
      v += w2[i] * x2[i];
      v += w3[i] * x3[i];
      c[i] = v;
    }
  } else {
    for (int64_t i = 0; i < Di; ++i) c[i] = b[i];
    for (int64_t j = 0; j < W; ++j) {
      if (!xs[j]) continue;
      const T* x = xs[j];
      const T* w = w_t + j * Di;
      for (int64_t i = 0; i < Di; ++i) c[i] += w[i] * x[i];
    }
  }
  for (int64_t i = 0; i < Di; ++i) xc[i] = Silu(c[i]);
}

// Delta = softplus(pre + b) over a row, pre updated in place.
template <typename T>
void SoftplusRow(const T* b, int64_t Di, T* pre, T* dt) {
  for (int64_t i = 0; i < Di; ++i) {
    pre[i] += b[i];
    dt[i] = Softplus(pre[i]);
  }
}

}  // namespace

template <typename T>
void MambaBlockCpu<T>::Recompute(const T* u, int64_t halo, int64_t M, Acts& a,
                                  bool with_z) const {
  const int64_t P = halo + M, Di2 = 2 * Di_, Q = R_ + 2 * N_;
  a.halo = halo, a.M = M;
  a.r.resize(P), a.n.resize(P * D_), a.xz.resize(P * Di2);
  a.cpre.resize(M * Di_), a.xc.resize(M * Di_), a.dbc.resize(M * Q);
  a.dtpre.resize(M * Di_), a.dt.resize(M * Di_);

  RmsNormForward(u, P, D_, p_.norm.data(), cfg_.layer_norm_epsilon, a.n.data(), a.r.data());
  // x = W_in's first Di rows (its x half) times n, then z = the other half, when wanted: x must
  // be the same bits with or without z (tests/kernels/mamba_block_test.cc), and each half is a
  // product of its own (in f64 through OpenBLAS, which may sum differently with the width).
  in_x_.Apply(P, a.n.data(), D_, false, a.xz.data(), Di2);
  if (with_z) ZHalf(a);
  // Causal depthwise conv and silu, row by row; x before the sequence is 0 (no tap).
  std::vector<const T*> xs(W_);
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t j = 0; j < W_; ++j) {
      const int64_t p = halo + t - (W_ - 1) + j;
      xs[j] = p < 0 ? nullptr : a.xz.data() + p * Di2;
    }
    ConvSiluRow<T>(xs.data(), conv_t_.data(), p_.conv_b.data(), W_, Di_,
                   a.cpre.data() + t * Di_, a.xc.data() + t * Di_);
  }
  x_proj_.Apply(M, a.xc.data(), Di_, false, a.dbc.data(), Q);
  dt_proj_.Apply(M, a.dbc.data(), Q, false, a.dtpre.data(), Di_);
  for (int64_t t = 0; t < M; ++t)
    SoftplusRow<T>(p_.dt_b.data(), Di_, a.dtpre.data() + t * Di_, a.dt.data() + t * Di_);
}

template <typename T>
bool MambaBlockCpu<T>::TakeCarried(const T* u, Kept& kept, bool by_summary) const {
  KeptStore& store = kept.store();
  store.EndCarry(kept.carried), kept.carried = 0;
  kept.stage = Kept::Stage::kEmpty;
  store.CountCarryUse(by_summary, kept.rows.len);
  kept.TakeSpares();  // uncounted there, so that the set's growth below fits
  const bool whole = kept.pool->Recount(&kept, SetBytes(kept.rows));
  Acts& a = kept.a;
  const int64_t n = a.M * Di_;
  a.dt.resize(n);  // Delta = softplus(pre) (pre + b, as stored), as Recompute makes it
  for (int64_t i = 0; i < n; ++i) a.dt[i] = Softplus(a.dtpre[i]);
  if (by_summary) {  // its scan reads Delta alone: Backward refills the rest
    kept.refill_pending = true;
  } else {
    FinishRefill(u, kept);
  }
  return whole;
}

template <typename T>
void MambaBlockCpu<T>::FinishRefill(const T* u, Kept& kept) const {
  Acts& a = kept.a;
  const int64_t P = a.halo + a.M, n = a.M * Di_;
  a.n.resize(P * D_);
  RmsNormApply(u, P, D_, p_.norm.data(), a.r.data(), a.n.data());
  a.xc.resize(n);  // x' = silu(c), as Recompute makes it
  for (int64_t i = 0; i < n; ++i) a.xc[i] = Silu(a.cpre[i]);
  kept.refill_pending = false;
}

template <typename T>
void MambaBlockCpu<T>::ZHalf(Acts& a) const {
  const int64_t P = a.halo + a.M;
  in_z_.Apply(P, a.n.data(), D_, false, a.xz.data() + Di_, 2 * Di_);
}

namespace {

// The block's per-thread scratch (kernels/cpu/scratch.h).
enum Slot { kY, kYbar, kDo, kSigZ, kDdt, kDxc, kDB, kDC, kDA, kDxz, kDdbc, kDconv, kDn, kSlots };

// S (Di) = sum over the chunk's rows of Delta_t, in row order.
template <typename T>
void SumDelta(const AlignedVector<T>& dt, int64_t len, int64_t Di, T* S) {
  std::fill(S, S + Di, T(0));
  for (int64_t t = 0; t < len; ++t)
    for (int64_t i = 0; i < Di; ++i) S[i] += dt[t * Di + i];
}
}  // namespace

template <typename T>
void MambaBlockCpu<T>::LocalSummary(const T* u, ChunkRows rows, T* h_local, T* S,
                                     Kept* keep) const {
  thread_local Acts scratch;
  Acts& a = keep ? keep->a : scratch;
  Recompute(u, rows.halo, rows.len, a, /*with_z=*/false);
  const ScanInputs<T> in = a.Scan(Di_, N_, R_, A_.data());
  ScanForward<T>(in, rows.len, nullptr, p_.Dskip.data(), h_local, nullptr);
  SumDelta(a.dt, rows.len, Di_, S);
  if (keep) keep->stage = Kept::Stage::kForward, keep->rows = rows;
}

template <typename T>
void MambaBlockCpu<T>::Forward(const T* u, ChunkRows rows, const T* h0, T* u_next, T* h_end,
                               Kept* kept, int64_t room_for) const {
  thread_local Acts scratch;
  const int64_t len = rows.len, Di2 = 2 * Di_;
  if (kept && kept->stage == Kept::Stage::kEmpty) {  // MakeKeptToCarry's: all to compute
    Recompute(u, rows.halo, len, kept->a);
    kept->rows = rows;
  } else if (kept) {  // LocalSummary's x half, conv, x_proj and Delta: only z is left to compute
    ADJSH_CHECK(kept->Holds(Kept::Stage::kForward, rows), "Forward given another chunk's set");
    ZHalf(kept->a);
    kept->stage = Kept::Stage::kEmpty;
  } else {
    Recompute(u, rows.halo, len, scratch);
  }
  const Acts& a = kept ? kept->a : scratch;
  const ScanInputs<T> in = a.Scan(Di_, N_, R_, A_.data());
  AlignedVector<T>& y = ThreadScratch<T>(kY, len * Di_);
  ScanForward<T>(in, len, h0, p_.Dskip.data(), h_end, y.data());
  // o = y . silu(z), reusing y.
  for (int64_t t = 0; t < len; ++t) {
    const T* z = a.xz.data() + (rows.halo + t) * Di2 + Di_;
    for (int64_t i = 0; i < Di_; ++i) y[t * Di_ + i] *= Silu(z[i]);
  }
  const T* u_own = u + rows.halo * D_;
  std::copy(u_own, u_own + len * D_, u_next);
  out_proj_.Apply(len, y.data(), Di_, true, u_next, D_);
  // The set now holds the rows' whole forward: carried for AdjointSummary if the budget allows,
  // keeping (and counted for) only what cannot be refilled; the rest goes to the spares.
  if (kept && room_for >= 0) {
    const int64_t bytes = kept->CarriedBytes();
    if (kept->store().TryCarry(bytes, room_for * SetBytes(rows))) {
      kept->ShedSpares();
      kept->stage = Kept::Stage::kCarried, kept->carried = bytes;
    }
  }
}

template <typename T>
void MambaBlockCpu<T>::AdjointSummary(const T* u, ChunkRows rows, const T* g, T* m, T* S,
                                       Kept* keep) const {
  thread_local Acts scratch;
  Acts& a = keep ? keep->a : scratch;
  const int64_t len = rows.len, Di2 = 2 * Di_;
  bool kept_whole = keep != nullptr;
  if (Carries(keep, rows)) {  // Forward's activations
    kept_whole = TakeCarried(u, *keep, /*by_summary=*/true);
  } else {
    Recompute(u, rows.halo, len, a);  // kept for Backward
  }
  // ybar = (g W_out) . silu(z)   (len, Di); g W_out kept as Backward's dL/do.
  AlignedVector<T>& ybar = ThreadScratch<T>(kYbar, len * Di_);
  T* d_o = ybar.data();
  if (keep) keep->d_o.resize(len * Di_), d_o = keep->d_o.data();
  out_back_.Apply(len, g, D_, false, d_o, Di_);
  for (int64_t t = 0; t < len; ++t) {
    const T* z = a.xz.data() + (rows.halo + t) * Di2 + Di_;
    for (int64_t i = 0; i < Di_; ++i) ybar[t * Di_ + i] = d_o[t * Di_ + i] * Silu(z[i]);
  }
  if (kept_whole) keep->stage = Kept::Stage::kBackward, keep->rows = rows;
  const ScanInputs<T> in = a.Scan(Di_, N_, R_, A_.data());
  ScanAdjointSummary<T>(in, len, ybar.data(), m);
  SumDelta(a.dt, len, Di_, S);
}

template <typename T>
void MambaBlockCpu<T>::Backward(const T* u, ChunkRows rows, const T* g, const T* h0, const T* mu,
                                int64_t window, LayerParams<T>& grad, T* du, T* du_halo,
                                T* mu_out, Kept* kept) const {
  const int64_t halo = rows.halo, len = rows.len, M = len + rows.ahead;
  const int64_t Di2 = 2 * Di_, Q = R_ + 2 * N_, P = halo + len;
  thread_local Acts scratch;

  // dL/do = g W_out and ybar = dL/do . silu(z), for all M rows (the lookahead needs ybar);
  // sig = sigmoid(z) kept for the gate's backward below (silu(z) = z sig, silu'(z) =
  // SiluGradGivenSigmoid(z, sig) of math.h: one exp instead of three).
  AlignedVector<T>& d_o = kept ? kept->d_o : ThreadScratch<T>(kDo, M * Di_);
  const bool carried = window == 0 && Carries(kept, rows);  // a span with no AdjointSummary
  if (carried) {  // Forward's recompute: dL/do is left
    TakeCarried(u, *kept, /*by_summary=*/false);  // used here once, whole or not
    d_o.resize(M * Di_);
  } else if (kept) {  // AdjointSummary's recompute and dL/do
    ADJSH_CHECK(window == 0 && kept->Holds(Kept::Stage::kBackward, rows),
                "Backward given another chunk's set, or a truncated window");
    if (kept->refill_pending) FinishRefill(u, *kept);
  } else {
    Recompute(u, halo, M, scratch);
  }
  if (kept) kept->stage = Kept::Stage::kEmpty;
  if (carried || !kept)
    out_back_.Apply(M, g, D_, false, d_o.data(), Di_);
  const Acts& a = kept ? kept->a : scratch;
  AlignedVector<T>& ybar = ThreadScratch<T>(kYbar, M * Di_);
  AlignedVector<T>& sig = ThreadScratch<T>(kSigZ, M * Di_);
  for (int64_t t = 0; t < M; ++t) {
    const T* z = a.xz.data() + (halo + t) * Di2 + Di_;
    T* s = sig.data() + t * Di_;
    for (int64_t i = 0; i < Di_; ++i) {
      s[i] = Sigmoid(z[i]);
      ybar[t * Di_ + i] = d_o[t * Di_ + i] * (z[i] * s[i]);
    }
  }

  // The scan's adjoint and VJPs (kernels/cpu/scan_block.h).
  AlignedVector<T>& y = ThreadScratch<T>(kY, len * Di_);
  AlignedVector<T>& ddt = ThreadScratch<T>(kDdt, len * Di_);
  AlignedVector<T>& dxc = ThreadScratch<T>(kDxc, len * Di_);
  AlignedVector<T>& dB = ThreadScratch<T>(kDB, len * N_, true);
  AlignedVector<T>& dC = ThreadScratch<T>(kDC, len * N_, true);
  AlignedVector<T>& dA = ThreadScratch<T>(kDA, Di_ * N_, true);
  ScanGrads<T> sg{y.data(), ddt.data(), dxc.data(), dB.data(), dC.data(), dA.data(),
                  grad.Dskip.data(), window == 0 ? mu_out : nullptr};
  const ScanInputs<T> in = a.Scan(Di_, N_, R_, A_.data());
  const ScanBackwardOptions opt{len, window};
  ScanBackward<T>(in, opt, h0, mu, ybar.data(), p_.Dskip.data(), sg);
  for (int64_t k = 0; k < Di_ * N_; ++k) grad.A_log[k] += dA[k] * A_[k];  // dA/dA_log = A

  // Gate and out_proj: o = y . silu(z); dW_out += g^T o; dz = dL/do . y . silu'(z).
  // dL/d[x; z], halo + own rows: every element written below (halo rows' dz is 0).
  AlignedVector<T>& dxz = ThreadScratch<T>(kDxz, P * Di2);
  for (int64_t p = 0; p < halo; ++p) std::fill_n(dxz.data() + p * Di2 + Di_, Di_, T(0));
  for (int64_t t = 0; t < len; ++t) {
    const T* z = a.xz.data() + (halo + t) * Di2 + Di_;
    const T* s = sig.data() + t * Di_;
    T* dz = dxz.data() + (halo + t) * Di2 + Di_;
    for (int64_t i = 0; i < Di_; ++i) {
      const int64_t k = t * Di_ + i;
      dz[i] = d_o[k] * y[k] * SiluGradGivenSigmoid(z[i], s[i]);
      y[k] *= z[i] * s[i];  // y becomes o
    }
  }
  WeightGrad<T>(D_, Di_, len, g, D_, y.data(), Di_, grad.out_proj.data(), Di_);

  // Delta = softplus(W_dt d + b_dt): dpre = dDelta . sigmoid(pre). The sigmoids here and in
  // silu's derivative below are computed where they are read, not kept from the forward's exps:
  // two (M, Di) arrays fewer to write, read back and count in every kept set.
  for (int64_t t = 0; t < len; ++t)
    for (int64_t i = 0; i < Di_; ++i) {
      T& v = ddt[t * Di_ + i];
      v *= SoftplusGrad(a.dtpre[t * Di_ + i]);
      grad.dt_b[i] += v;
    }
  AlignedVector<T>& ddbc = ThreadScratch<T>(kDdbc, len * Q);  // dL/d[d | B | C]
  WeightGrad<T>(Di_, R_, len, ddt.data(), Di_, a.dbc.data(), Q, grad.dt_w.data(), R_);
  dt_back_.Apply(len, ddt.data(), Di_, false, ddbc.data(), Q);
  for (int64_t t = 0; t < len; ++t)
    for (int64_t n = 0; n < N_; ++n) {
      ddbc[t * Q + R_ + n] = dB[t * N_ + n];
      ddbc[t * Q + R_ + N_ + n] = dC[t * N_ + n];
    }
  // x_proj: dW_x += ddbc^T x'; dx' += ddbc W_x.
  WeightGrad<T>(Q, Di_, len, ddbc.data(), Q, a.xc.data(), Di_, grad.x_proj.data(), Di_);
  x_back_.Apply(len, ddbc.data(), Q, true, dxc.data(), Di_);

  // silu and the causal conv: dc = dx' . silu'(c); db += dc; dw[:, j] += dc_t . x_{t-W+1+j};
  // dx_p = sum over the rows t = p - halo + W - 1 - j in the chunk of w[:, j] . dc_t, summed
  // with t ascending (rows before the chunk are the halo rows). Each dx row is written once.
  AlignedVector<T>& dconv_t = ThreadScratch<T>(kDconv, W_ * Di_, true);  // (W, Di)
  for (int64_t t = 0; t < len; ++t) {
    T* dc = dxc.data() + t * Di_;
    for (int64_t i = 0; i < Di_; ++i) {
      dc[i] *= SiluGrad(a.cpre[t * Di_ + i]);
      grad.conv_b[i] += dc[i];
    }
    for (int64_t j = 0; j < W_; ++j) {
      const int64_t p = halo + t - (W_ - 1) + j;
      if (p < 0) continue;
      const T* x = a.xz.data() + p * Di2;
      T* dw = dconv_t.data() + j * Di_;
      for (int64_t i = 0; i < Di_; ++i) dw[i] += dc[i] * x[i];
    }
  }
  for (int64_t p = 0; p < P; ++p) {
    T* dx = dxz.data() + p * Di2;
    std::fill_n(dx, Di_, T(0));
    for (int64_t j = W_ - 1; j >= 0; --j) {  // t ascending
      const int64_t t = p - halo + (W_ - 1) - j;
      if (t < 0 || t >= len) continue;
      const T* dc = dxc.data() + t * Di_;
      const T* w = conv_t_.data() + j * Di_;
      for (int64_t i = 0; i < Di_; ++i) dx[i] += w[i] * dc[i];
    }
  }
  for (int64_t i = 0; i < Di_; ++i)
    for (int64_t j = 0; j < W_; ++j) grad.conv_w[i * W_ + j] += dconv_t[j * Di_ + i];

  // in_proj: dW_in += dxz^T n; dn = dxz W_in; then RMSNorm back to u.
  WeightGrad<T>(Di2, D_, P, dxz.data(), Di2, a.n.data(), D_, grad.in_proj.data(), D_);
  AlignedVector<T>& dn = ThreadScratch<T>(kDn, P * D_);
  in_back_.Apply(P, dxz.data(), Di2, false, dn.data(), D_);
  RmsNormBackward(u, P, D_, p_.norm.data(), a.r.data(), dn.data(), grad.norm.data(), dn.data());
  std::copy(dn.begin(), dn.begin() + halo * D_, du_halo);
  for (int64_t k = 0; k < len * D_; ++k) du[k] = g[k] + dn[halo * D_ + k];
}

template class MambaBlockCpu<float>;
template class MambaBlockCpu<double>;

}  // namespace adjsh::cpu
