// The gradient computation by the in-process chunk schedules: wavefront, two-pass, layered.
#include "engine/gradient_step.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "common/check.h"
#include "common/tokens.h"
#include "kernels/decay.h"
#include "kernels/cpu/lm_head.h"

namespace adjsh {
namespace {

// Whether Run takes the wavefront's one graph (RunWavefront).
bool WholeGraph(const GradOptions& opt) {
  return opt.schedule == Schedule::kWavefront && opt.window == 0 &&
         opt.cotangent == Cotangent::kExact;
}

}  // namespace

template <typename T>
GradientStep<T>::GradientStep(const ModelParams<T>& params, std::span<const uint32_t> tokens,
                              const GradOptions& opt)
    : p_(params),
      cfg_(params.config),
      tokens_(tokens),
      opt_(opt),
      pool_(std::make_unique<ThreadPool>(opt.threads)),
      T_(static_cast<int64_t>(tokens.size())),
      C_(std::min<int64_t>(opt.chunk, T_)),
      starts_(ChunkStarts(T_, C_, WholeGraph(opt))),
      nC_(static_cast<int64_t>(starts_.size()) - 1),
      D_(cfg_.hidden_size),
      K_(cfg_.num_hidden_layers),
      DiN_(cfg_.inner() * cfg_.state_size),
      max_ahead_(2 * pool_->size()) {
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend = MakeBackend<T>(opt.device);
  ADJSH_CHECK(backend.ok(), "the device was not checked (CheckDevice) before the step");
  backend_ = *std::move(backend);
  // The CPU's blocks pack their weights when made, a cost per layer: one layer a thread.
  blocks_.resize(K_);
  const auto make = [&](int64_t k) { blocks_[k] = backend_->MakeBlock(cfg_, p_.layers[k]); };
  if (opt.device.is_cpu()) {
    pool_->ParallelFor(K_, make);
  } else {
    for (int64_t k = 0; k < K_; ++k) make(k);
  }
  A_ = DecayRates(p_);
  result_.grad = ZeroParams<T>(cfg_);
}

template <typename T>
GradResult<T> GradientStep<T>::Run() {
  if (WholeGraph(opt_)) {
    Prepare(/*embed=*/false);
    RunWavefront();
    return Finish();
  }
  Prepare(/*embed=*/true);
  if (opt_.schedule == Schedule::kWavefront) {
    ForwardWavefront();
  } else {
    ForwardTwoPass();
  }
  result_.loss = Head();
  BackwardLayered();
  return Finish();
}

template <typename T>
GradResult<T> GradientStep<T>::Finish() {
  const bool top = opt_.cotangent == Cotangent::kTopOfStack;
  const bool layered = opt_.schedule != Schedule::kWavefront || opt_.window != 0 || top;
  const int64_t stored = static_cast<int64_t>(StoredRows<T>::ValueBytes(opt_.storage));
  const int64_t compute_rows = T_ * D_ + (layered ? T_ * D_ : 0) + (top ? T_ * D_ : 0);
  const int64_t extra = opt_.schedule == Schedule::kTwoPass ? 3 * nC_ * DiN_ : 0;
  result_.stored_bytes = stored * K_ * (T_ * D_ + nC_ * DiN_) +
                         static_cast<int64_t>(sizeof(T)) * (compute_rows + extra);
  if (!layered) {
    EmbeddingGrad(top_.data());  // dL/du^1
    top_ = std::vector<T>();
  }
  return std::move(result_);
}

// Why the wavefront's graph tapers: its first forward task and its last backward task each run
// alone, and so do the top layer's last forward, the last chunk's head and the first backward
// task between them (each waits on the one before), and the threads idle there; quarter chunks
// at each end shorten those stretches (docs/BENCHMARKS.md, "What was tried"). A task has a fixed
// cost too (a short task costs more than its share of rows), so only the two ends are cut. Starts at multiples of 64 keep the CPU
// head's blocks of 64 rows whole (RunWavefront).
template <typename T>
std::vector<int64_t> GradientStep<T>::ChunkStarts(int64_t rows, int64_t C, bool tapered) {
  std::vector<int64_t> starts;
  if (tapered && C % 256 == 0 && rows >= 2 * C) {
    // The first chunk C / 4 rows; the last C / 4 to C / 4 + 63, from the multiple of 64 before
    // it (no multiple of C after it: T = 4C + 1 would end in a 64-row and a 1-row chunk).
    const int64_t e = C / 4, last = (rows - e) / 64 * 64;
    starts = {0, e};
    for (int64_t t = C; t < last; t += C) starts.push_back(t);
    starts.push_back(last);
  } else {
    for (int64_t t = 0; t < rows; t += C) starts.push_back(t);
  }
  starts.push_back(rows);
  return starts;
}

template <typename T>
typename GradientStep<T>::ChunkSpan GradientStep<T>::Span(int64_t c) const {
  const int64_t t0 = starts_[c];
  return {t0, starts_[c + 1] - t0, std::min(cfg_.conv_kernel - 1, t0)};
}

template <typename T>
void GradientStep<T>::Progress(std::string_view phase, int64_t done, int64_t total) const {
  if (opt_.progress) opt_.progress(phase, done, total);
}

// Room for the layer inputs and chunk states; embed: u^1 = the embedding rows of the tokens
// (else each chunk's forward task on layer 1 embeds its own rows: EmbedRows).
// The layer inputs are left uninitialised: every row is written (u^1, u^{k+1} by the forward)
// before it is read. Zeroing them here would be a serial pass over K T D values on one thread;
// left alone, the forward's first writes fault the pages in on every thread.
template <typename T>
void GradientStep<T>::Prepare(bool embed) {
  layer_in_.clear();
  states_.clear();
  for (int64_t k = 0; k < K_; ++k) {
    absl::StatusOr<StoredRows<T>> rows =
        StoredRows<T>::Create(T_ * D_, opt_.storage, opt_.spill_dir, /*zeroed=*/false);
    if (!rows.ok()) {  // e.g. the disk is full: slower to fail than to keep the rows in memory
      std::fprintf(stderr, "adjsh: %s; keeping layer %lld's inputs in memory\n",
                   std::string(rows.status().message()).c_str(), static_cast<long long>(k));
      rows = StoredRows<T>::Create(T_ * D_, opt_.storage, "", /*zeroed=*/false);
    }
    layer_in_.push_back(std::move(*rows));
    states_.push_back(*StoredRows<T>::Create(nC_ * DiN_, opt_.storage, ""));  // heap: no error
  }
  top_.assign(T_ * D_, T(0));
  mu_.assign(K_ * nC_, std::vector<T>());
  halos_.assign(K_ * nC_, std::vector<T>());
  if (embed) EmbedRows(0, T_);
}

template <typename T>
void GradientStep<T>::EmbedRows(int64_t t0, int64_t n) {
  for (int64_t t = t0; t < t0 + n; ++t)
    layer_in_[0].Commit(t * D_, D_, p_.embed.data() + int64_t{tokens_[t]} * D_);
}

// u^{k+1} of chunk c's rows from u^k's (and the W - 1 before them) and the state before the
// chunk; the state after it is stored for chunk c + 1.
template <typename T>
void GradientStep<T>::ForwardTask(int64_t k, int64_t c, bool carry) {
  const ChunkSpan s = Span(c);
  if (k == 0 && carry) EmbedRows(s.t0, s.len);  // RunWavefront's Prepare left them
  thread_local std::vector<T> u_in, h_in, u_out, h_out;
  const T* u = InputRows(k, s.t0 - s.halo, s.halo + s.len, u_in);
  const T* h0 = states_[k].Read(c * DiN_, DiN_, h_in);
  const bool top = k + 1 == K_, last = c + 1 == nC_;
  T* out = top ? top_.data() + s.t0 * D_
               : layer_in_[k + 1].WriteBuffer(s.t0 * D_, s.len * D_, u_out);
  if (last) h_out.resize(DiN_);  // the final state has no reader
  T* h_end = last ? h_out.data() : states_[k].WriteBuffer((c + 1) * DiN_, DiN_, h_out);
  if (carry) {
    carried_[k * nC_ + c] =
        blocks_[k]->ForwardKept(nullptr, u, {s.halo, s.len, 0}, h0, out, h_end, /*room_for=*/0);
  } else {
    blocks_[k]->Forward(u, {s.halo, s.len, 0}, h0, out, h_end);
  }
  if (!top) layer_in_[k + 1].Commit(s.t0 * D_, s.len * D_, out);
  if (!last) states_[k].Commit((c + 1) * DiN_, DiN_, h_end);
  // Layer k's last chunk: layers finish in order (each waits on the one below).
  if (last) Progress("forward", k + 1, K_);
}

// Task (k, c) once (k - 1, c) and (k, c - 1) are done: its state comes from (k, c - 1).
template <typename T>
void GradientStep<T>::ForwardWavefront() {
  RunDag(
      *pool_, K_ * nC_,
      [&](int64_t id) {
        const int64_t k = id / nC_, c = id % nC_;
        std::vector<int64_t> next;
        if (k + 1 < K_) next.push_back(id + nC_);
        if (c + 1 < nC_) next.push_back(id + 1);
        return next;
      },
      [&](int64_t id) { ForwardTask(id / nC_, id % nC_, false); });
}

template <typename T>
void GradientStep<T>::ForwardTwoPass() {
  const int64_t Di = cfg_.inner();
  std::vector<T> h_local(nC_ * DiN_), S(nC_ * Di), h_chain;
  for (int64_t k = 0; k < K_; ++k) {
    BlockBackend<T>& block = *blocks_[k];
    // F1: local summaries of every chunk but the last (nothing follows it).
    pool_->ParallelFor(nC_ - 1, [&](int64_t c) {
      const ChunkSpan s = Span(c);
      thread_local std::vector<T> u_in;
      block.LocalSummary(InputRows(k, s.t0 - s.halo, s.halo + s.len, u_in), {s.halo, s.len, 0},
                         h_local.data() + c * DiN_, S.data() + c * Di);
    });
    // h0(c + 1) = P_c . h0(c) + h_local(c), h0(0) = 0, in the compute type; then stored.
    T* h0 = states_[k].WriteBuffer(0, nC_ * DiN_, h_chain);
    std::fill(h0, h0 + DiN_, T(0));
    for (int64_t c = 0; c + 1 < nC_; ++c) {
      DecayAdd(A_.data() + k * DiN_, S.data() + c * Di, h0 + c * DiN_,
               h_local.data() + c * DiN_, DiN_, cfg_.state_size, h0 + (c + 1) * DiN_);
    }
    states_[k].Commit(0, nC_ * DiN_, h0);
    // F2: the layer output from the (stored) chunk states.
    pool_->ParallelFor(nC_, [&](int64_t c) {
      const ChunkSpan s = Span(c);
      thread_local std::vector<T> u_in, h_in, u_out, h_end;
      h_end.resize(DiN_);
      const bool top = k + 1 == K_;
      T* out = top ? top_.data() + s.t0 * D_
                   : layer_in_[k + 1].WriteBuffer(s.t0 * D_, s.len * D_, u_out);
      block.Forward(InputRows(k, s.t0 - s.halo, s.halo + s.len, u_in), {s.halo, s.len, 0},
                    states_[k].Read(c * DiN_, DiN_, h_in), out, h_end.data());
      if (!top) layer_in_[k + 1].Commit(s.t0 * D_, s.len * D_, out);
    });
    Progress("forward", k + 1, K_);
  }
}

// Targets the loss mask leaves out are -1.
template <typename T>
void GradientStep<T>::HeadTargets() {
  const std::span<const uint8_t> mask = opt_.loss_mask;
  targets_.assign(T_, -1);
  for (int64_t t = 0; t + 1 < T_; ++t)
    if (mask.empty() || mask[t + 1] != 0) targets_[t] = int64_t{tokens_[t + 1]};
  n_targets_ = CountedTargets(mask, T_);
  correct_ = 0;
}

// The head matrix's gradient (the embedding's when tied: before the lookups' part) and dw_f
// accumulate in the backend's head, which blocks rows and vocabulary itself.
template <typename T>
double GradientStep<T>::HeadRows(int64_t t0, int64_t n, T* du) {
  cpu::LmHeadArgs<T> args{n,
                          D_,
                          cfg_.vocab_size,
                          cfg_.layer_norm_epsilon,
                          p_.head().data(),
                          p_.norm_f.data(),
                          top_.data() + t0 * D_,
                          targets_.data() + t0,
                          T(1) / T(n_targets_)};
  if (!opt_.loss_mask.empty()) args.correct = &correct_;
  return backend_->HeadForwardBackward(args, du, result_.grad.head().data(),
                                       result_.grad.norm_f.data());
}

template <typename T>
double GradientStep<T>::MeanLoss(double sum) {
  result_.targets = n_targets_;
  result_.correct = opt_.loss_mask.empty() ? -1 : correct_;
  return sum / static_cast<double>(n_targets_);
}

// Loss and dL/du^{K+1} (into top_, replacing u^{K+1}).
template <typename T>
double GradientStep<T>::Head() {
  HeadTargets();
  std::vector<T> du(T_ * D_);
  const double sum = HeadRows(0, T_, du.data());
  top_ = std::move(du);
  Progress("head", 1, 1);
  return MeanLoss(sum);
}

// Layer by layer, all chunks of a layer in parallel (two-pass exact, or truncated).
template <typename T>
void GradientStep<T>::BackwardLayered() {
  ModelParams<T>& grad = result_.grad;
  const int64_t Di = cfg_.inner();
  std::vector<T> g = std::move(top_);  // dL/du^{k+1}
  std::vector<T> du(T_ * D_);          // dL/du^k
  std::vector<T> m(nC_ * DiN_), S(nC_ * Di), mu(nC_ * DiN_);
  const bool exact = opt_.window == 0;
  // Proposition 3: every layer's cotangent is dL/du^{K+1}; dL/du^k of layers above the first
  // is dropped.
  const bool top = opt_.cotangent == Cotangent::kTopOfStack;
  const std::vector<T> top_g = top ? g : std::vector<T>();
  for (int64_t k = K_ - 1; k >= 0; --k) {
    BlockBackend<T>& block = *blocks_[k];
    if (exact) {
      // A: summaries of every chunk but the first (nothing precedes it).
      pool_->ParallelFor(nC_ - 1, [&](int64_t c1) {
        const int64_t c = c1 + 1;
        const ChunkSpan s = Span(c);
        thread_local std::vector<T> u_in;
        block.AdjointSummary(InputRows(k, s.t0 - s.halo, s.halo + s.len, u_in),
                             {s.halo, s.len, 0}, g.data() + s.t0 * D_, m.data() + c * DiN_,
                             S.data() + c * Di);
      });
      // mu_{c-1} = m_c + P_c . mu_c, mu_{last} = 0.
      std::fill(mu.end() - DiN_, mu.end(), T(0));
      for (int64_t c = nC_ - 1; c > 0; --c) {
        DecayAdd(A_.data() + k * DiN_, S.data() + c * Di, mu.data() + c * DiN_,
                 m.data() + c * DiN_, DiN_, cfg_.state_size, mu.data() + (c - 1) * DiN_);
      }
    }
    // B: the VJPs; partials and conv-halo contributions added in chunk order.
    struct Out {
      LayerParams<T> grad;
      std::vector<T> du_halo;
    };
    OrderedParallelFor<Out>(
        *pool_, nC_, max_ahead_,
        [&](int64_t c) {
          const ChunkSpan s = Span(c);
          const int64_t ahead = exact ? 0 : std::min(opt_.window - 1, T_ - s.t0 - s.len);
          Out o{ZeroLayer<T>(cfg_), std::vector<T>(s.halo * D_)};
          thread_local std::vector<T> u_in, h_in;
          block.Backward(InputRows(k, s.t0 - s.halo, s.halo + s.len + ahead, u_in),
                         {s.halo, s.len, ahead}, g.data() + s.t0 * D_,
                         states_[k].Read(c * DiN_, DiN_, h_in),
                         exact ? mu.data() + c * DiN_ : nullptr, opt_.window, o.grad,
                         du.data() + s.t0 * D_, o.du_halo.data(), nullptr);
          return o;
        },
        [&](int64_t c, Out&& o) {
          AddInto(grad.layers[k], o.grad);
          const ChunkSpan s = Span(c);
          T* rows = du.data() + (s.t0 - s.halo) * D_;
          for (int64_t q = 0; q < s.halo * D_; ++q) rows[q] += o.du_halo[q];
        });
    std::swap(g, du);
    if (top && k > 0) std::copy(top_g.begin(), top_g.end(), g.begin());
    layer_in_[k] = StoredRows<T>();  // no longer needed
    states_[k] = StoredRows<T>();
    Progress("backward", K_ - k, K_);
  }
  EmbeddingGrad(g.data());
}

// The embedding lookup: dE[token_t] += dL/du^1_t, in token order.
template <typename T>
void GradientStep<T>::EmbeddingGrad(const T* du1) {
  ModelParams<T>& grad = result_.grad;
  for (int64_t t = 0; t < T_; ++t) {
    T* row = grad.embed.data() + int64_t{tokens_[t]} * D_;
    for (int64_t d = 0; d < D_; ++d) row[d] += du1[t * D_ + d];
  }
}

template <typename T>
std::pair<int64_t, int64_t> GradientStep<T>::TaskLayerChunk(int64_t task) const {
  return {K_ - 1 - task / nC_, nC_ - 1 - task % nC_};
}

template <typename T>
std::vector<int64_t> GradientStep<T>::BackwardSuccessors(int64_t task) const {
  const auto [k, c] = TaskLayerChunk(task);
  std::vector<int64_t> next;
  if (k > 0) next.push_back(task + nC_);
  if (c > 0) next.push_back(task + 1);
  return next;
}

// On the step's own rows, with the set the chunk's forward carried (null: the block
// recomputes). A layer's tasks run one at a time, c descending, so they add into its gradient
// in a fixed order. Up to kChunksPerPartial C rows add straight into the layer's gradient;
// longer sequences add into a partial per group of chunks starting in the same
// kChunksPerPartial C rows (Group), which is added to the gradient when the group is done:
// every row added into one sum over a long sequence loses precision in f32 (8M tokens: 4e-3
// relative on the norm's weight), and a partial per chunk cost each task a zeroing and a sum of
// all the layer's parameters (7 MB of memory traffic at D = 256).
template <typename T>
void GradientStep<T>::BackwardTask(int64_t task) {
  const auto [k, c] = TaskLayerChunk(task);
  const ChunkSpan s = Span(c);
  thread_local std::vector<T> u_in, h_in, du, mu_last;
  const bool grouped = Group(nC_ - 1) > 0;
  LayerParams<T>& into = grouped ? partials_[k] : result_.grad.layers[k];
  // The group's first task (c descending): its partial from zero.
  if (grouped && (c + 1 == nC_ || Group(c + 1) != Group(c))) SetZero(into, cfg_);
  const T* u = InputRows(k, s.t0 - s.halo, s.halo + s.len, u_in);
  const T* h0 = states_[k].Read(c * DiN_, DiN_, h_in);
  const std::vector<T>& mu = mu_[k * nC_ + c];  // empty for the last chunk
  std::vector<T>& mu_out = c > 0 ? mu_[k * nC_ + c - 1] : mu_last;
  mu_out.resize(DiN_);
  std::vector<T>& halo = halos_[k * nC_ + c];
  halo.assign(s.halo * D_, T(0));
  du.resize(s.len * D_);
  T* g = top_.data() + s.t0 * D_;  // dL/du^{k+1}: (k + 1, c) has been applied
  std::unique_ptr<KeptActs> carried = std::move(carried_[k * nC_ + c]);
  if (carried) {
    blocks_[k]->BackwardKept(std::move(carried), u, {s.halo, s.len, 0}, g, h0,
                             mu.empty() ? nullptr : mu.data(), into, du.data(), halo.data(),
                             mu_out.data());
  } else {
    blocks_[k]->Backward(u, {s.halo, s.len, 0}, g, h0, mu.empty() ? nullptr : mu.data(), 0,
                         into, du.data(), halo.data(), mu_out.data());
  }
  if (grouped && (c == 0 || Group(c - 1) != Group(c))) AddInto(result_.grad.layers[k], into);
  mu_[k * nC_ + c] = std::vector<T>();
  // dL/du^k replaces dL/du^{k+1} on the chunk's rows (this task was their only reader); the
  // halo rows of later chunks that fall here are added in chunk order.
  std::copy(du.begin(), du.end(), g);
  for (int64_t c2 = c + 1; c2 < nC_; ++c2) {
    const ChunkSpan s2 = Span(c2);
    const int64_t first = s2.t0 - s2.halo;  // the halo's first row
    if (first >= s.t0 + s.len) break;
    const std::vector<T>& later = halos_[k * nC_ + c2];
    for (int64_t r = std::max(first, s.t0); r < s2.t0 && r < s.t0 + s.len; ++r)
      for (int64_t d = 0; d < D_; ++d) g[(r - s.t0) * D_ + d] += later[(r - first) * D_ + d];
  }
  if (c == 0) Progress("backward", K_ - k, K_);  // layer k done; layers finish in order
}

// The whole exact gradient as one graph of 2 K chunks + chunks tasks, so that the head's rows
// run beside the forward's last tasks instead of alone between forward and backward:
//   [0, K chunks)               forward (k, c), id k chunks + c
//   [K chunks, + chunks)        head(c): chunk c's rows, after forward (K - 1, c) and head(c - 1)
//   [(K + 1) chunks, + K chunks) backward task b (TaskLayerChunk); (K - 1, c) after head(c)
// The head's calls go in row order (head(c - 1) before head(c)); on the CPU, whose head works
// in blocks of 64 rows, the head matrix's and dw_f's gradients add as Head()'s do when the
// chunk is a multiple of 64 (else its blocks restart at each chunk). The loss is summed per
// chunk, then in chunk order. A device's head (CUDA) copies the head matrix each call, so
// there head(nC - 1) runs the whole head and the others nothing. Ready tasks run by rank:
// forward and head by their diagonal, backward by its own.
template <typename T>
void GradientStep<T>::RunWavefront() {
  const int64_t KC = K_ * nC_, head0 = KC, back0 = KC + nC_;
  HeadTargets();
  carried_.clear();
  carried_.resize(KC);
  partials_.resize(Group(nC_ - 1) > 0 ? K_ : 0);
  std::vector<double> loss(nC_);
  std::vector<T> du_rows;  // head(c)'s dL/du^{K+1} before it replaces u^{K+1} (one at a time)
  const bool head_per_chunk = opt_.device.is_cpu();
  RunDag(
      *pool_, 2 * KC + nC_,
      [&](int64_t id) {
        std::vector<int64_t> next;
        if (id < head0) {
          const int64_t k = id / nC_, c = id % nC_;
          next.push_back(k + 1 < K_ ? id + nC_ : head0 + c);
          if (c + 1 < nC_) next.push_back(id + 1);
        } else if (id < back0) {
          const int64_t c = id - head0;
          if (c + 1 < nC_) next.push_back(id + 1);
          next.push_back(back0 + (nC_ - 1 - c));  // backward task (K - 1, c)
        } else {
          for (int64_t b : BackwardSuccessors(id - back0)) next.push_back(back0 + b);
        }
        return next;
      },
      [&](int64_t id) {
        if (id < head0) {
          ForwardTask(id / nC_, id % nC_, /*carry=*/true);
        } else if (id < back0) {
          const int64_t c = id - head0;
          if (head_per_chunk || c + 1 == nC_) {
            const ChunkSpan s = head_per_chunk ? Span(c) : ChunkSpan{0, T_, 0};  // else all rows
            du_rows.resize(s.len * D_);
            loss[c] = HeadRows(s.t0, s.len, du_rows.data());
            std::copy(du_rows.begin(), du_rows.end(), top_.begin() + s.t0 * D_);
          }
          if (c + 1 == nC_) Progress("head", 1, 1);
        } else {
          BackwardTask(id - back0);
        }
      },
      [&](int64_t id) -> int64_t {
        if (id < head0) return id / nC_ + id % nC_;
        if (id < back0) return K_ + (id - head0);
        const auto [k, c] = TaskLayerChunk(id - back0);
        return KC + (K_ - 1 - k) + (nC_ - 1 - c);  // after every forward and head
      });
  double sum = 0;
  for (double l : loss) sum += l;
  result_.loss = MeanLoss(sum);
}

template class GradientStep<float>;
template class GradientStep<double>;

}  // namespace adjsh
