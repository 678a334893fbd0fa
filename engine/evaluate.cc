// Evaluation as a wavefront of (stage, chunk) tasks over one sequence at a time. Stage k < K is
// layer k (stage 0 also looks up the embedding); stage K is the head's loss. Wave w runs stage
// k on chunk w - k for every k at once: stage k reads its input rows from in[k][c % 2] (written
// by stage k - 1 in wave w - 1) and writes in[k + 1][c % 2], while stage k - 1 writes the other
// parity, so no buffer is read and written in one wave. The layers are the model type's streams
// (engine/model_stream.h): each layer's state and last W - 1 input rows are all that survive a
// chunk. Written once for both model types.
#include "engine/evaluate.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model_stream.h"
#include "engine/segments.h"
#include "common/thread_pool.h"

namespace adjsh {
namespace {

template <typename Streams>
class SequenceEval {
 public:
  using T = typename Streams::Value;

  SequenceEval(Streams& streams, const TokenData& tokens, int64_t chunk)
      : s_(streams), p_(streams.params()), tokens_(tokens), C_(chunk) {
    K_ = p_.config.num_hidden_layers, D_ = p_.config.hidden_size, H_ = s_.halo();
    in_.assign((K_ + 1) * 2, std::vector<T>((H_ + C_) * D_));
  }

  // The loss sum of the sequence of tokens [start, start + len), len >= 2; on_chunk(rows) after
  // each chunk's head.
  double Run(int64_t start, int64_t len, ThreadPool& pool,
             const std::function<void(int64_t)>& on_chunk) {
    start_ = start, len_ = len;
    nC_ = (len + C_ - 1) / C_;
    s_.Reset();
    loss_ = 0;
    std::vector<int64_t> stages;
    for (int64_t w = 0; w < nC_ + K_; ++w) {
      stages.clear();
      for (int64_t k = 0; k <= K_; ++k)
        if (w - k >= 0 && w - k < nC_) stages.push_back(k);
      pool.ParallelFor(static_cast<int64_t>(stages.size()), [&](int64_t i) {
        const int64_t k = stages[i], c = w - k;
        if (k < K_) {
          Layer(k, c);
        } else {
          Head(c);  // one head task per wave: the loss is summed in chunk order
        }
      });
      if (w >= K_) on_chunk(Rows(w - K_));
    }
    return loss_;
  }

 private:
  int64_t Rows(int64_t c) const { return std::min(C_, len_ - c * C_); }
  T* Input(int64_t k, int64_t c) { return in_[k * 2 + c % 2].data(); }

  void Layer(int64_t k, int64_t c) {
    const int64_t len = Rows(c);
    T* x = Input(k, c);
    if (k == 0) {  // the embedding rows of the chunk's tokens
      std::vector<uint32_t> ids(static_cast<size_t>(len));
      tokens_.Copy(start_ + c * C_, len, ids.data());
      for (int64_t t = 0; t < len; ++t) {
        const T* row = p_.embed.data() + int64_t{ids[t]} * D_;
        std::copy(row, row + D_, x + (H_ + t) * D_);
      }
    }
    s_.Advance(k, x, len, Input(k + 1, c) + H_ * D_);
  }

  void Head(int64_t c) {
    const int64_t len = Rows(c), first = c * C_;
    // Targets: the next token of each row; the sequence's last row has none.
    const int64_t known = std::min(len, len_ - 1 - first);
    std::vector<uint32_t> ids(static_cast<size_t>(known));
    tokens_.Copy(start_ + first + 1, known, ids.data());
    std::vector<int64_t> targets(static_cast<size_t>(len), -1);
    for (int64_t t = 0; t < known; ++t) targets[t] = ids[t];
    cpu::LmHeadArgs<T> args{len,
                            D_,
                            p_.config.vocab_size,
                            p_.config.layer_norm_epsilon,
                            p_.head().data(),
                            p_.norm_f.data(),
                            Input(K_, c) + H_ * D_,
                            targets.data(),
                            T(1)};
    loss_ += s_.backend().HeadLoss(args);
  }

  Streams& s_;
  const typename Streams::Params& p_;
  const TokenData& tokens_;
  const int64_t C_;
  int64_t K_ = 0, D_ = 0, H_ = 0;
  int64_t start_ = 0, len_ = 0, nC_ = 0;
  std::vector<std::vector<T>> in_;  // (K + 1) x 2 parities of (H + C, D)
  double loss_ = 0;
};

// The evaluation of a model of either type through its streams (engine/model_stream.h).
template <typename Streams>
absl::StatusOr<EvalResult> EvaluateWith(const typename Streams::Params& params,
                                        const TokenData& tokens, const EvalOptions& options) {
  absl::StatusOr<int64_t> count = EvalTokenCount(tokens, options);
  if (!count.ok()) return count.status();
  const int64_t n = *count;
  absl::StatusOr<Streams> streams = Streams::Make(params, options.device, /*head=*/true);
  if (!streams.ok()) return streams.status();
  // The ids, once (the corpus may be a mapped file larger than memory).
  if (absl::Status s = tokens.CheckInVocab(params.config.vocab_size, n); !s.ok()) return s;
  ThreadPool pool(options.threads);
  // A chunk longer than the longest sequence is that sequence in one chunk: the same losses,
  // and buffers of the sequence's rows, not of the chunk asked for.
  const int64_t longest = options.context > 0 ? std::min(options.context, n) : n;
  SequenceEval<Streams> eval(*streams, tokens, std::min(options.chunk, longest));
  return SumSequenceLosses(n, options, [&](int64_t start, int64_t len, const auto& rows_done) {
    return eval.Run(start, len, pool, rows_done);
  });
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> EvalSequences(int64_t n, int64_t context) {
  const int64_t T_seq = context > 0 ? context : n;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t start = 0; start + 1 < n; start += T_seq)  // a last lone token predicts nothing
    out.emplace_back(start, std::min(T_seq, n - start));
  return out;
}

absl::StatusOr<int64_t> EvalTokenCount(const TokenData& tokens, const EvalOptions& options) {
  if (options.chunk < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("chunk must be >= 1, got %d",
                                                      options.chunk));
  }
  if (options.context < 0 || options.context == 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "context must be >= 2 tokens (or 0: the whole corpus), got %d", options.context));
  }
  if (options.max_tokens < 0) {
    return absl::InvalidArgumentError("max_tokens must be >= 0 (0: every token)");
  }
  const int64_t n = options.max_tokens > 0 ? std::min(tokens.size(), options.max_tokens)
                                           : tokens.size();
  if (n < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("evaluation needs at least 2 tokens, got %d", n));
  }
  return n;
}

EvalResult SumSequenceLosses(int64_t n, const EvalOptions& options,
                             const SequenceLossFn& sequence_loss) {
  EvalResult result;
  int64_t done = 0;
  const auto rows_done = [&](int64_t rows) {
    done += rows;  // pieces share their boundary token: at most n
    if (options.progress) options.progress(std::min(done, n), n);
  };
  for (const auto& [start, len] : EvalSequences(n, options.context)) {
    // Pieces [a, s] with the target s, then [s, ...]: their targets are the sequence's.
    for (const auto& [first, piece] : PiecesOfWindow(start, len, options.doc_starts))
      result.loss_sum += sequence_loss(start + first, piece, rows_done);
    result.targets += len - 1;
    result.tokens += len;
    ++result.sequences;
  }
  return result;
}

template <typename T>
absl::StatusOr<EvalResult> Evaluate(const ModelParams<T>& params, const TokenData& tokens,
                                    const EvalOptions& options) {
  return EvaluateWith<ModelStreams<ModelParams<T>>>(params, tokens, options);
}

template <typename T>
absl::StatusOr<EvalResult> Evaluate(const Mamba2Params<T>& params, const TokenData& tokens,
                                    const EvalOptions& options) {
  return EvaluateWith<ModelStreams<Mamba2Params<T>>>(params, tokens, options);
}

template absl::StatusOr<EvalResult> Evaluate<float>(const ModelParams<float>&, const TokenData&,
                                                    const EvalOptions&);
template absl::StatusOr<EvalResult> Evaluate<double>(const ModelParams<double>&,
                                                     const TokenData&, const EvalOptions&);
template absl::StatusOr<EvalResult> Evaluate<float>(const Mamba2Params<float>&, const TokenData&,
                                                    const EvalOptions&);
template absl::StatusOr<EvalResult> Evaluate<double>(const Mamba2Params<double>&,
                                                     const TokenData&, const EvalOptions&);

}  // namespace adjsh
