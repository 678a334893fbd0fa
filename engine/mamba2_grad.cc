// Mamba-2's exact gradient (engine/mamba2_grad.h): the embedding, the layers chunk by chunk
// (engine/mamba2_layer.h), the LM head. Kept for the backward: every layer's input (T, D) and
// dL/du (T, D); per layer in turn, the states at its chunk starts, (T / C) H P N numbers,
// rebuilt by a forward sweep of that layer before its backward runs its chunks in reverse,
// each recomputing its own activations from its input and its start states.
#include "engine/mamba2_grad.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokens.h"
#include "engine/mamba2_layer.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/lm_head.h"

namespace adjsh {
namespace {

// The rows a chunk starting at t0 reads of a layer input (T, D): from its conv halo on.
template <typename T>
const T* Rows(const std::vector<T>& u, int64_t t0, const Mamba2Dims& d) {
  return u.data() + (t0 - std::min(d.W - 1, t0)) * d.D;
}

}  // namespace

template <typename T>
absl::StatusOr<Mamba2GradResult<T>> Mamba2Gradient(const Mamba2Params<T>& params,
                                                   std::span<const uint32_t> tokens,
                                                   int64_t chunk,
                                                   std::span<const uint8_t> loss_mask) {
  const Mamba2Config& cfg = params.config;
  const int64_t T_ = static_cast<int64_t>(tokens.size());
  if (T_ < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a gradient needs at least 2 tokens (one next-token target), got ", T_));
  }
  if (chunk < 1) return absl::InvalidArgumentError(absl::StrCat("chunk must be >= 1, got ", chunk));
  if (absl::Status s = CheckTokensInVocab(tokens, cfg.vocab_size); !s.ok()) return s;
  if (absl::Status s = CheckLossMask(loss_mask, T_); !s.ok()) return s;
  const Mamba2Dims d(cfg);
  const int64_t K = cfg.num_hidden_layers, V = cfg.vocab_size, C = std::min(chunk, T_);
  const int64_t chunks = (T_ + C - 1) / C, HPN = d.H * d.P * d.N;
  // u[k]: the input of layer k; u[K] the last layer's output.
  std::vector<std::vector<T>> u(K + 1, std::vector<T>(T_ * d.D));
  for (int64_t t = 0; t < T_; ++t)
    std::copy_n(params.embed.begin() + tokens[t] * d.D, d.D, u[0].begin() + t * d.D);
  Mamba2ChunkActs<T> acts;
  std::vector<T> S(HPN);
  for (int64_t k = 0; k < K; ++k) {
    std::fill(S.begin(), S.end(), T(0));
    for (int64_t t0 = 0; t0 < T_; t0 += C) {
      const int64_t t1 = std::min(T_, t0 + C);
      T* out = u[k + 1].data() + t0 * d.D;
      Mamba2ChunkForward(params.layers[k], cfg, Rows(u[k], t0, d), t0, t1, S.data(), acts, out);
      const T* in = u[k].data() + t0 * d.D;
      for (int64_t i = 0; i < (t1 - t0) * d.D; ++i) out[i] += in[i];
    }
  }
  Mamba2GradResult<T> r;
  r.grad = ZeroMamba2Params<T>(cfg);
  r.targets = CountedTargets(loss_mask, T_);
  if (!loss_mask.empty()) r.correct = 0;
  // The head, 64 rows at a time: dL/du^K into du, dE += dlogits^T nf in row-block order.
  std::vector<T> du(T_ * d.D), ddu(T_ * d.D);
  std::vector<T>& dhead = cfg.tie_word_embeddings ? r.grad.embed : r.grad.lm_head;
  constexpr int64_t kRows = 64;
  std::vector<T> dlogits(kRows * V), nf(kRows * d.D);
  std::vector<int64_t> targets(kRows);
  double loss = 0;
  for (int64_t t0 = 0; t0 < T_; t0 += kRows) {
    const int64_t m = std::min(kRows, T_ - t0);
    for (int64_t i = 0; i < m; ++i)
      targets[i] = t0 + i + 1 < T_ && (loss_mask.empty() || loss_mask[t0 + i + 1] != 0)
                       ? static_cast<int64_t>(tokens[t0 + i + 1])
                       : int64_t{-1};
    cpu::LmHeadArgs<T> args;
    args.M = m, args.D = d.D, args.V = V, args.eps = cfg.layer_norm_epsilon;
    args.E = params.head().data(), args.w_f = params.norm_f.data();
    args.u = u[K].data() + t0 * d.D, args.targets = targets.data();
    args.scale = T(1) / T(r.targets);
    if (!loss_mask.empty()) args.correct = &r.correct;
    loss += cpu::LmHeadForwardBackward(args, du.data() + t0 * d.D, dlogits.data(), nf.data(),
                                       r.grad.norm_f.data());
    cpu::Gemm<T>(cpu::Trans::kYes, cpu::Trans::kNo, V, d.D, m, T(1), dlogits.data(), V,
                 nf.data(), d.D, T(1), dhead.data(), d.D);
  }
  r.loss = loss / static_cast<double>(r.targets);
  std::vector<T> starts(chunks * HPN), scratch(C * d.D), carry(HPN), halo((d.W - 1) * d.Cc);
  for (int64_t k = K - 1; k >= 0; --k) {
    const Mamba2Layer<T>& l = params.layers[k];
    std::fill(S.begin(), S.end(), T(0));
    for (int64_t c = 0; c < chunks; ++c) {  // the states at the chunk starts
      std::copy(S.begin(), S.end(), starts.begin() + c * HPN);
      Mamba2ChunkForward(l, cfg, Rows(u[k], c * C, d), c * C, std::min(T_, (c + 1) * C),
                         S.data(), acts, static_cast<T*>(nullptr));
    }
    std::fill(carry.begin(), carry.end(), T(0));
    std::fill(halo.begin(), halo.end(), T(0));
    for (int64_t c = chunks - 1; c >= 0; --c) {
      const int64_t t0 = c * C, t1 = std::min(T_, t0 + C);
      std::copy_n(starts.begin() + c * HPN, HPN, S.begin());
      const T* rows = Rows(u[k], t0, d);
      Mamba2ChunkForward(l, cfg, rows, t0, t1, S.data(), acts, scratch.data());
      Mamba2ChunkBackward(l, cfg, rows, acts, du.data() + t0 * d.D, carry.data(),
                          halo.data(), r.grad.layers[k], ddu.data() + t0 * d.D);
    }
    std::swap(du, ddu);
  }
  for (int64_t t = 0; t < T_; ++t) {
    T* row = r.grad.embed.data() + tokens[t] * d.D;
    for (int64_t i = 0; i < d.D; ++i) row[i] += du[t * d.D + i];
  }
  return r;
}

template absl::StatusOr<Mamba2GradResult<float>> Mamba2Gradient<float>(
    const Mamba2Params<float>&, std::span<const uint32_t>, int64_t, std::span<const uint8_t>);
template absl::StatusOr<Mamba2GradResult<double>> Mamba2Gradient<double>(
    const Mamba2Params<double>&, std::span<const uint32_t>, int64_t, std::span<const uint8_t>);

}  // namespace adjsh
