#include "engine/adjoint_engine.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/thread_pool.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/lm_head.h"
#include "kernels/cpu/mamba_block.h"

namespace adjsh {
namespace {

constexpr int64_t kHeadRows = 64;  // rows per LM-head block: bounds the (rows, V) logits

// The tokens of chunk c: [t0, t0 + len), with halo conv rows before it.
struct ChunkSpan {
  int64_t t0, len, halo;
};

template <typename T>
class Engine {
 public:
  Engine(const ModelParams<T>& params, std::span<const uint32_t> tokens, const GradOptions& opt)
      : p_(params),
        cfg_(params.config),
        tokens_(tokens),
        opt_(opt),
        pool_(opt.threads),
        T_(static_cast<int64_t>(tokens.size())),
        C_(std::min<int64_t>(opt.chunk, T_)),
        nC_((T_ + C_ - 1) / C_),
        D_(cfg_.hidden_size),
        K_(cfg_.num_hidden_layers),
        DiN_(cfg_.inner() * cfg_.state_size),
        max_ahead_(2 * pool_.size()) {
    blocks_.reserve(K_);
    for (int64_t k = 0; k < K_; ++k) blocks_.emplace_back(cfg_, p_.layers[k]);
  }

  GradResult<T> Run() {
    GradResult<T> result;
    result.grad = ZeroParams<T>(cfg_);
    const bool wavefront = opt_.schedule == Schedule::kWavefront;
    Prepare();
    if (wavefront) {
      ForwardWavefront();
    } else {
      ForwardTwoPass();
    }
    result.loss = Head(result.grad);
    if (wavefront && opt_.window == 0) {
      BackwardWavefront(result.grad);
    } else {
      BackwardLayered(result.grad);
    }
    const int64_t rows = (K_ + 1) * T_ * D_ + (wavefront && opt_.window == 0 ? 0 : T_ * D_);
    const int64_t extra = wavefront ? 0 : 3 * nC_ * DiN_;  // summaries and mu of one layer
    result.stored_bytes = static_cast<int64_t>(sizeof(T)) * (rows + K_ * nC_ * DiN_ + extra);
    return result;
  }

 private:
  ChunkSpan Span(int64_t c) const {
    const int64_t t0 = c * C_;
    return {t0, std::min(C_, T_ - t0), std::min(cfg_.conv_kernel - 1, t0)};
  }
  void Progress(std::string_view phase, int64_t done, int64_t total) const {
    if (opt_.progress) opt_.progress(phase, done, total);
  }

  // P_c . v for a chunk with delta sums S (Di): (exp(A S) . v)[i, n].
  void ApplyDecay(const std::vector<T>& A, const T* S, const T* v, T* out) const {
    const int64_t N = cfg_.state_size;
    for (int64_t k = 0; k < DiN_; ++k) out[k] = std::exp(A[k] * S[k / N]) * v[k];
  }

  // u^1 = the embedding rows of the tokens; room for the other layer inputs and chunk states.
  void Prepare() {
    layer_in_.assign(K_, std::vector<T>(T_ * D_));
    states_.assign(K_, std::vector<T>(nC_ * DiN_));
    top_.assign(T_ * D_, T(0));
    for (int64_t t = 0; t < T_; ++t)
      std::copy_n(p_.embed.data() + int64_t{tokens_[t]} * D_, D_, layer_in_[0].data() + t * D_);
  }

  T* Rows(int64_t k) { return k < K_ ? layer_in_[k].data() : top_.data(); }  // u^k, k = 0..K

  // Task (k, c) once (k - 1, c) and (k, c - 1) are done: its state comes from (k, c - 1).
  void ForwardWavefront() {
    RunDag(
        pool_, K_ * nC_,
        [&](int64_t id) {
          const int64_t k = id / nC_, c = id % nC_;
          std::vector<int64_t> next;
          if (k + 1 < K_) next.push_back(id + nC_);
          if (c + 1 < nC_) next.push_back(id + 1);
          return next;
        },
        [&](int64_t id) {
          const int64_t k = id / nC_, c = id % nC_;
          const ChunkSpan s = Span(c);
          T* h0 = states_[k].data() + c * DiN_;
          std::vector<T> last;  // the final state has no reader
          if (c + 1 == nC_) last.resize(DiN_);
          T* h_end = c + 1 < nC_ ? h0 + DiN_ : last.data();
          blocks_[k].Forward(Rows(k) + (s.t0 - s.halo) * D_, {s.halo, s.len, 0}, h0,
                             Rows(k + 1) + s.t0 * D_, h_end);
        });
    Progress("forward", K_, K_);
  }

  void ForwardTwoPass() {
    const int64_t Di = cfg_.inner();
    std::vector<T> h_local(nC_ * DiN_), S(nC_ * Di);
    for (int64_t k = 0; k < K_; ++k) {
      const cpu::MambaBlockCpu<T>& block = blocks_[k];
      const T* u = Rows(k);
      T* out = Rows(k + 1);
      // F1: local summaries of every chunk but the last (nothing follows it).
      pool_.ParallelFor(nC_ - 1, [&](int64_t c) {
        const ChunkSpan s = Span(c);
        block.LocalSummary(u + (s.t0 - s.halo) * D_, {s.halo, s.len, 0},
                           h_local.data() + c * DiN_, S.data() + c * Di);
      });
      // h0(c + 1) = P_c . h0(c) + h_local(c), h0(0) = 0.
      T* h0 = states_[k].data();
      std::fill(h0, h0 + DiN_, T(0));
      for (int64_t c = 0; c + 1 < nC_; ++c) {
        T* next = h0 + (c + 1) * DiN_;
        ApplyDecay(block.A(), S.data() + c * Di, h0 + c * DiN_, next);
        for (int64_t q = 0; q < DiN_; ++q) next[q] += h_local[c * DiN_ + q];
      }
      // F2: the layer output from the true chunk states.
      pool_.ParallelFor(nC_, [&](int64_t c) {
        const ChunkSpan s = Span(c);
        std::vector<T> h_end(DiN_);
        block.Forward(u + (s.t0 - s.halo) * D_, {s.halo, s.len, 0}, h0 + c * DiN_,
                      out + s.t0 * D_, h_end.data());
      });
      Progress("forward", k + 1, K_);
    }
  }

  // Loss and dL/du^{K+1} (into top_, replacing u^{K+1}); dE and dw_f from the head.
  double Head(ModelParams<T>& grad) {
    struct Out {
      std::vector<T> du, dlogits, nf, dw_f;
      double loss = 0;
    };
    const int64_t V = cfg_.vocab_size, nb = (T_ + kHeadRows - 1) / kHeadRows;
    const T scale = T(1) / T(T_ - 1);
    double loss = 0;
    OrderedParallelFor<Out>(
        pool_, nb, max_ahead_,
        [&](int64_t b) {
          const int64_t r0 = b * kHeadRows, M = std::min(kHeadRows, T_ - r0);
          std::vector<int64_t> targets(M);
          for (int64_t t = 0; t < M; ++t)
            targets[t] = r0 + t + 1 < T_ ? int64_t{tokens_[r0 + t + 1]} : -1;
          Out o;
          o.du.resize(M * D_), o.dlogits.resize(M * V), o.nf.resize(M * D_);
          o.dw_f.assign(D_, T(0));
          cpu::LmHeadArgs<T> args{M, D_, V, cfg_.layer_norm_epsilon, p_.embed.data(),
                                  p_.norm_f.data(), top_.data() + r0 * D_, targets.data(), scale};
          o.loss = cpu::LmHeadForwardBackward<T>(args, o.du.data(), o.dlogits.data(), o.nf.data(),
                                                 o.dw_f.data());
          return o;
        },
        [&](int64_t b, Out&& o) {
          const int64_t r0 = b * kHeadRows, M = std::min(kHeadRows, T_ - r0);
          cpu::Gemm<T>(cpu::Trans::kYes, cpu::Trans::kNo, V, D_, M, 1, o.dlogits.data(), V,
                       o.nf.data(), D_, 1, grad.embed.data(), D_);
          for (int64_t d = 0; d < D_; ++d) grad.norm_f[d] += o.dw_f[d];
          std::copy(o.du.begin(), o.du.end(), top_.data() + r0 * D_);
          loss += o.loss;
        });
    Progress("head", 1, 1);
    return loss / static_cast<double>(T_ - 1);
  }

  // Task (k, c) once (k + 1, c) (its dL/du^{k+1} rows, halos included) and (k, c + 1) (its mu)
  // are done. Tasks of a layer run one after another (c descending); each computes its partial
  // gradient from zero, as a remote worker would, and adds it to the layer's gradient in that
  // order. dL/du^k of chunk c replaces u^k there once no task reads it (its halo readers,
  // chunks > c, ran before it); mu_{c-1} replaces h0 of chunk c.
  void BackwardWavefront(ModelParams<T>& grad) {
    std::vector<std::vector<T>> halos(K_ * nC_);  // (k, c): dL/du for the W - 1 rows before c
    auto task = [&](int64_t k, int64_t c) { return (K_ - 1 - k) * nC_ + (nC_ - 1 - c); };
    RunDag(
        pool_, K_ * nC_,
        [&](int64_t id) {
          const int64_t k = K_ - 1 - id / nC_, c = nC_ - 1 - id % nC_;
          std::vector<int64_t> next;
          if (k > 0) next.push_back(task(k - 1, c));
          if (c > 0) next.push_back(task(k, c - 1));
          return next;
        },
        [&](int64_t id) {
          const int64_t k = K_ - 1 - id / nC_, c = nC_ - 1 - id % nC_;
          const ChunkSpan s = Span(c);
          T* states = states_[k].data();
          // Per-thread buffers, reused from task to task (fresh large blocks cost page faults).
          thread_local std::vector<T> du, mu_out;
          thread_local LayerParams<T> partial;
          du.resize(s.len * D_);
          mu_out.resize(DiN_);
          for (const auto& slot : LayerParamSlots<T>()) {
            int64_t n = 1;
            for (int64_t d : slot.shape(cfg_)) n *= d;
            (partial.*slot.member).assign(n, T(0));
          }
          std::vector<T>& halo = halos[k * nC_ + c];
          halo.assign(s.halo * D_, T(0));
          blocks_[k].Backward(Rows(k) + (s.t0 - s.halo) * D_, {s.halo, s.len, 0},
                              Rows(k + 1) + s.t0 * D_, states + c * DiN_,
                              c + 1 < nC_ ? states + (c + 1) * DiN_ : nullptr, 0, partial,
                              du.data(), halo.data(), mu_out.data());
          AddInto(grad.layers[k], partial);
          if (c > 0) std::copy(mu_out.begin(), mu_out.end(), states + c * DiN_);
          // Later chunks' halo contributions to these rows, in chunk order.
          for (int64_t c2 = c + 1; c2 < nC_; ++c2) {
            const ChunkSpan s2 = Span(c2);
            const int64_t first = s2.t0 - s2.halo;  // the halo's first row
            if (first >= s.t0 + s.len) break;
            for (int64_t r = std::max(first, s.t0); r < s2.t0 && r < s.t0 + s.len; ++r)
              for (int64_t d = 0; d < D_; ++d)
                du[(r - s.t0) * D_ + d] += halos[k * nC_ + c2][(r - first) * D_ + d];
          }
          std::copy(du.begin(), du.end(), Rows(k) + s.t0 * D_);
        });
    top_ = std::vector<T>();
    Progress("backward", K_, K_);
    EmbeddingGrad(Rows(0), grad);
  }

  // Layer by layer, all chunks of a layer in parallel (two-pass exact, or truncated).
  void BackwardLayered(ModelParams<T>& grad) {
    const int64_t Di = cfg_.inner();
    std::vector<T> g = std::move(top_);  // dL/du^{k+1}
    std::vector<T> du(T_ * D_);          // dL/du^k
    std::vector<T> m(nC_ * DiN_), S(nC_ * Di), mu(nC_ * DiN_);
    const bool exact = opt_.window == 0;
    for (int64_t k = K_ - 1; k >= 0; --k) {
      const cpu::MambaBlockCpu<T>& block = blocks_[k];
      const T* u = layer_in_[k].data();
      if (exact) {
        // A: summaries of every chunk but the first (nothing precedes it).
        pool_.ParallelFor(nC_ - 1, [&](int64_t c1) {
          const int64_t c = c1 + 1;
          const ChunkSpan s = Span(c);
          block.AdjointSummary(u + (s.t0 - s.halo) * D_, {s.halo, s.len, 0}, g.data() + s.t0 * D_,
                               m.data() + c * DiN_, S.data() + c * Di);
        });
        // mu_{c-1} = m_c + P_c . mu_c, mu_{last} = 0.
        std::fill(mu.end() - DiN_, mu.end(), T(0));
        for (int64_t c = nC_ - 1; c > 0; --c) {
          T* prev = mu.data() + (c - 1) * DiN_;
          ApplyDecay(block.A(), S.data() + c * Di, mu.data() + c * DiN_, prev);
          for (int64_t q = 0; q < DiN_; ++q) prev[q] += m[c * DiN_ + q];
        }
      }
      // B: the VJPs; partials and conv-halo contributions added in chunk order.
      struct Out {
        LayerParams<T> grad;
        std::vector<T> du_halo;
      };
      OrderedParallelFor<Out>(
          pool_, nC_, max_ahead_,
          [&](int64_t c) {
            const ChunkSpan s = Span(c);
            const int64_t ahead = exact ? 0 : std::min(opt_.window - 1, T_ - s.t0 - s.len);
            Out o{ZeroLayer<T>(cfg_), std::vector<T>(s.halo * D_)};
            block.Backward(u + (s.t0 - s.halo) * D_, {s.halo, s.len, ahead}, g.data() + s.t0 * D_,
                           states_[k].data() + c * DiN_, exact ? mu.data() + c * DiN_ : nullptr,
                           opt_.window, o.grad, du.data() + s.t0 * D_, o.du_halo.data());
            return o;
          },
          [&](int64_t c, Out&& o) {
            AddInto(grad.layers[k], o.grad);
            const ChunkSpan s = Span(c);
            T* rows = du.data() + (s.t0 - s.halo) * D_;
            for (int64_t q = 0; q < s.halo * D_; ++q) rows[q] += o.du_halo[q];
          });
      std::swap(g, du);
      layer_in_[k] = std::vector<T>();  // no longer needed
      Progress("backward", K_ - k, K_);
    }
    EmbeddingGrad(g.data(), grad);
  }

  // The embedding lookup: dE[token_t] += dL/du^1_t, in token order.
  void EmbeddingGrad(const T* du1, ModelParams<T>& grad) const {
    for (int64_t t = 0; t < T_; ++t) {
      T* row = grad.embed.data() + int64_t{tokens_[t]} * D_;
      for (int64_t d = 0; d < D_; ++d) row[d] += du1[t * D_ + d];
    }
  }

  const ModelParams<T>& p_;
  const MambaConfig& cfg_;
  std::span<const uint32_t> tokens_;
  const GradOptions& opt_;
  ThreadPool pool_;
  const int64_t T_, C_, nC_, D_, K_, DiN_, max_ahead_;
  std::vector<cpu::MambaBlockCpu<T>> blocks_;
  std::vector<std::vector<T>> layer_in_;  // K x (T, D): u^k
  std::vector<std::vector<T>> states_;    // K x (chunks, Di, N): h before each chunk
  std::vector<T> top_;                    // (T, D): u^{K+1}, then dL/du^{K+1}
};

}  // namespace

template <typename T>
absl::StatusOr<GradResult<T>> ComputeGradient(const ModelParams<T>& params,
                                              std::span<const uint32_t> tokens,
                                              const GradOptions& options) {
  if (tokens.size() < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the sequence has %d token(s): the next-token loss needs at least 2", tokens.size()));
  }
  if (options.chunk < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("chunk must be >= 1, got %d", options.chunk));
  }
  if (options.window < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("window must be >= 1 (or 0 for exact), got %d", options.window));
  }
  const int64_t V = params.config.vocab_size;
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (int64_t{tokens[t]} >= V) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token %d at position %d is outside the vocabulary (vocab_size %d)", tokens[t], t, V));
    }
  }
  cpu::InitBlasSingleThreaded();
  return Engine<T>(params, tokens, options).Run();
}

template absl::StatusOr<GradResult<float>> ComputeGradient<float>(const ModelParams<float>&,
                                                                  std::span<const uint32_t>,
                                                                  const GradOptions&);
template absl::StatusOr<GradResult<double>> ComputeGradient<double>(const ModelParams<double>&,
                                                                    std::span<const uint32_t>,
                                                                    const GradOptions&);

}  // namespace adjsh
