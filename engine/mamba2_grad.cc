// Mamba-2's exact gradient (engine/mamba2_grad.h): the embedding, the layers in the spans of
// engine/mamba2_spans.h (each span chunk by chunk, engine/mamba2_layer.h), the LM head. Kept for
// the backward: every layer's input (T, D), as stored (engine/stored_rows.h), and dL/du (T, D)
// twice (in and out of a layer); per layer in turn, the states at its chunk starts,
// (T / C) H P N numbers, rebuilt by a forward sweep of that layer before its backward runs its
// chunks in reverse, each recomputing its own activations from its input and its start states.
#include "engine/mamba2_grad.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokens.h"
#include "engine/mamba2_layer.h"
#include "engine/mamba2_spans.h"
#include "engine/span_plan.h"
#include "engine/stored_rows.h"
#include "engine/thread_pool.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/lm_head.h"

namespace adjsh {

Mamba2GradOptions Mamba2GradOptionsFrom(const GradOptions& options) {
  Mamba2GradOptions o;
  o.chunk = options.chunk;
  o.spans = options.spans;
  o.threads = options.threads;
  o.loss_mask = options.loss_mask;
  o.storage = options.storage;
  o.spill_dir = options.spill_dir;
  o.progress = options.progress;
  return o;
}

template <typename T>
absl::StatusOr<Mamba2GradResult<T>> Mamba2Gradient(const Mamba2Params<T>& params,
                                                   std::span<const uint32_t> tokens,
                                                   const Mamba2GradOptions& options) {
  const Mamba2Config& cfg = params.config;
  const int64_t T_ = static_cast<int64_t>(tokens.size());
  const std::span<const uint8_t> loss_mask = options.loss_mask;
  if (T_ < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a gradient needs at least 2 tokens (one next-token target), got ", T_));
  }
  if (options.chunk < 1)
    return absl::InvalidArgumentError(absl::StrCat("chunk must be >= 1, got ", options.chunk));
  if (absl::Status s = CheckTokensInVocab(tokens, cfg.vocab_size); !s.ok()) return s;
  if (absl::Status s = CheckLossMask(loss_mask, T_); !s.ok()) return s;
  const Mamba2Dims d(cfg);
  const int64_t K = cfg.num_hidden_layers, V = cfg.vocab_size, C = std::min(options.chunk, T_);
  const size_t TD = static_cast<size_t>(T_ * d.D);
  absl::StatusOr<SpanPlan> plan = SpanPlan::Make(T_, C, options.spans, K, d.W);
  if (!plan.ok()) return plan.status();
  ThreadPool pool(options.threads);
  Mamba2SpanSchedule<T> schedule(cfg, *plan, pool);
  // u[k]: the input of layer k, as stored; top: the last layer's output, in T.
  std::vector<StoredRows<T>> u;
  for (int64_t k = 0; k < K; ++k) {
    absl::StatusOr<StoredRows<T>> rows =
        StoredRows<T>::Create(TD, options.storage, options.spill_dir);
    if (!rows.ok()) return rows.status();
    u.push_back(*std::move(rows));
  }
  std::vector<T> top(TD), out_scratch;
  for (int64_t t0 = 0; t0 < T_; t0 += C) {  // the embedding's rows, chunk by chunk
    const int64_t m = std::min(C, T_ - t0);
    const size_t at = static_cast<size_t>(t0 * d.D), n = static_cast<size_t>(m * d.D);
    T* dst = K > 0 ? u[0].WriteBuffer(at, n, out_scratch) : top.data() + at;
    for (int64_t t = 0; t < m; ++t)
      std::copy_n(params.embed.begin() + tokens[t0 + t] * d.D, d.D, dst + t * d.D);
    if (K > 0) u[0].Commit(at, n, dst);
  }
  const auto progress = [&](std::string_view phase, int64_t done, int64_t total) {
    if (options.progress) options.progress(phase, done, total);
  };
  for (int64_t k = 0; k < K; ++k) {
    schedule.Forward(k, params.layers[k], u[k], k + 1 < K ? &u[k + 1] : nullptr, top.data());
    progress("forward", k + 1, K);
  }
  Mamba2GradResult<T> r;
  r.grad = ZeroMamba2Params<T>(cfg);
  r.targets = CountedTargets(loss_mask, T_);
  if (!loss_mask.empty()) r.correct = 0;
  r.stored_bytes = static_cast<int64_t>(K * TD * StoredRows<T>::ValueBytes(options.storage) +
                                        (2 * TD + schedule.kept_values()) * sizeof(T));
  // The head, 64 rows at a time: dL/du^K into du, dE += dlogits^T nf in row-block order.
  std::vector<T>& du = top;  // each head block reads its rows of u^K, then writes dL/du there
  std::vector<T> ddu(TD);
  std::vector<T>& dhead = cfg.tie_word_embeddings ? r.grad.embed : r.grad.lm_head;
  constexpr int64_t kRows = 64;
  std::vector<T> dlogits(kRows * V), nf(kRows * d.D), urows(kRows * d.D);
  std::vector<int64_t> targets(kRows);
  double loss = 0;
  for (int64_t t0 = 0; t0 < T_; t0 += kRows) {
    const int64_t m = std::min(kRows, T_ - t0);
    for (int64_t i = 0; i < m; ++i)
      targets[i] = t0 + i + 1 < T_ && (loss_mask.empty() || loss_mask[t0 + i + 1] != 0)
                       ? static_cast<int64_t>(tokens[t0 + i + 1])
                       : int64_t{-1};
    std::copy_n(top.begin() + t0 * d.D, m * d.D, urows.begin());
    cpu::LmHeadArgs<T> args;
    args.M = m, args.D = d.D, args.V = V, args.eps = cfg.layer_norm_epsilon;
    args.E = params.head().data(), args.w_f = params.norm_f.data();
    args.u = urows.data(), args.targets = targets.data();
    args.scale = T(1) / T(r.targets);
    if (!loss_mask.empty()) args.correct = &r.correct;
    loss += cpu::LmHeadForwardBackward(args, du.data() + t0 * d.D, dlogits.data(), nf.data(),
                                       r.grad.norm_f.data());
    cpu::Gemm<T>(cpu::Trans::kYes, cpu::Trans::kNo, V, d.D, m, T(1), dlogits.data(), V,
                 nf.data(), d.D, T(1), dhead.data(), d.D);
  }
  r.loss = loss / static_cast<double>(r.targets);
  progress("head", 1, 1);
  for (int64_t k = K - 1; k >= 0; --k) {
    schedule.Backward(k, params.layers[k], u[k], du.data(), ddu.data(), r.grad.layers[k]);
    std::swap(du, ddu);
    progress("backward", K - k, K);
  }
  for (int64_t t = 0; t < T_; ++t) {
    T* row = r.grad.embed.data() + tokens[t] * d.D;
    for (int64_t i = 0; i < d.D; ++i) row[i] += du[t * d.D + i];
  }
  return r;
}

template absl::StatusOr<Mamba2GradResult<float>> Mamba2Gradient<float>(
    const Mamba2Params<float>&, std::span<const uint32_t>, const Mamba2GradOptions&);
template absl::StatusOr<Mamba2GradResult<double>> Mamba2Gradient<double>(
    const Mamba2Params<double>&, std::span<const uint32_t>, const Mamba2GradOptions&);

}  // namespace adjsh
