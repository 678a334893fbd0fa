#include "engine/mamba2_eval.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/mamba2_stream.h"

namespace adjsh {
namespace {

// One sequence's loss sum, chunk by chunk through every layer, the head through the backend.
template <typename T>
double SequenceLoss(const Mamba2BackendModel<T>& m, const TokenData& tokens, int64_t start,
                    int64_t len, int64_t chunk, const std::function<void(int64_t)>& rows_done) {
  const Mamba2Params<T>& p = *m.params;
  const Mamba2Config& cfg = p.config;
  const int64_t C = std::min(chunk, len);
  Mamba2Stream<T> stream(m);
  std::vector<T> x;
  std::vector<int64_t> targets(C);
  double loss = 0;
  for (int64_t t0 = 0; t0 < len; t0 += C) {
    const int64_t L = std::min(len, t0 + C) - t0;
    // The chunk's ids and one more (the last row's target, when the sequence goes on).
    const std::vector<uint32_t> ids = tokens.Slice(start + t0, std::min(L + 1, len - t0));
    stream.Advance(std::span(ids).first(L), x);
    for (int64_t i = 0; i < L; ++i)
      targets[i] = t0 + i + 1 < len ? static_cast<int64_t>(ids[i + 1]) : int64_t{-1};
    cpu::LmHeadArgs<T> args;
    args.M = L, args.D = cfg.hidden_size, args.V = cfg.vocab_size;
    args.eps = cfg.layer_norm_epsilon;
    args.E = p.head().data(), args.w_f = p.norm_f.data(), args.u = x.data();
    args.targets = targets.data();
    loss += m.backend->HeadLoss(args);
    rows_done(L);
  }
  return loss;
}

}  // namespace

template <typename T>
absl::StatusOr<EvalResult> Mamba2Evaluate(const Mamba2Params<T>& params, const TokenData& tokens,
                                          const EvalOptions& options) {
  absl::StatusOr<int64_t> count = EvalTokenCount(tokens, options);
  if (!count.ok()) return count.status();
  const int64_t n = *count;
  if (absl::Status s = tokens.CheckInVocab(params.config.vocab_size, n); !s.ok()) return s;
  absl::StatusOr<Mamba2DeviceModel<T>> model = Mamba2DeviceModel<T>::Make(params, options.device);
  if (!model.ok()) return model.status();
  return SumSequenceLosses(n, options, [&](int64_t start, int64_t len, const auto& rows_done) {
    return SequenceLoss(model->model, tokens, start, len, options.chunk, rows_done);
  });
}

template absl::StatusOr<EvalResult> Mamba2Evaluate<float>(const Mamba2Params<float>&,
                                                          const TokenData&, const EvalOptions&);
template absl::StatusOr<EvalResult> Mamba2Evaluate<double>(const Mamba2Params<double>&,
                                                           const TokenData&, const EvalOptions&);

}  // namespace adjsh
