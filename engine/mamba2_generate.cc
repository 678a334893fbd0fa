#include "engine/mamba2_generate.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokens.h"
#include "engine/mamba2_stream.h"
#include "engine/sample.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/rmsnorm.h"

namespace adjsh {

template <typename T>
absl::StatusOr<std::vector<uint32_t>> Mamba2Generate(
    const Mamba2Params<T>& params, std::span<const uint32_t> prompt, const GenerateOptions& o,
    const std::function<bool(uint32_t)>& on_token) {
  const Mamba2Config& c = params.config;
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (absl::Status s = CheckTokensInVocab(prompt, c.vocab_size); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("prompt: ", s.message()));
  }
  if (!(o.temperature >= 0) || o.top_k < 0 || o.max_new_tokens < 0 || o.chunk < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "need temperature >= 0, top_k >= 0, max_new_tokens >= 0 and chunk >= 1 (got %g, %d, "
        "%d, %d)", o.temperature, o.top_k, o.max_new_tokens, o.chunk));
  }
  const int64_t D = c.hidden_size, V = c.vocab_size;
  Mamba2Stream<T> stream(params);
  std::vector<T> x, last(D), nf(D), r(1);
  auto feed = [&](std::span<const uint32_t> ids) {
    for (size_t i = 0; i < ids.size(); i += o.chunk) {
      const size_t n = std::min<size_t>(o.chunk, ids.size() - i);
      stream.Advance(ids.subspan(i, n), x);
      std::copy(x.end() - D, x.end(), last.begin());
    }
  };
  std::mt19937_64 rng(o.seed);
  std::vector<T> logits(V);
  std::vector<uint32_t> out;
  feed(prompt);
  while (static_cast<int64_t>(out.size()) < o.max_new_tokens) {
    // The head of the last row: logits = rmsnorm(u; norm_f) head^T.
    cpu::RmsNormForward(last.data(), 1, D, params.norm_f.data(), c.layer_norm_epsilon, nf.data(),
                        r.data());
    cpu::Gemm<T>(cpu::Trans::kNo, cpu::Trans::kYes, 1, V, D, T(1), nf.data(), D,
                 params.head().data(), D, T(0), logits.data(), V);
    const uint32_t id = SampleToken(logits, o, rng);
    out.push_back(id);
    if (on_token && !on_token(id)) break;
    if (o.stop_id >= 0 && id == o.stop_id) break;
    if (static_cast<int64_t>(out.size()) < o.max_new_tokens) feed(std::span(&out.back(), 1));
  }
  return out;
}

template absl::StatusOr<std::vector<uint32_t>> Mamba2Generate<float>(
    const Mamba2Params<float>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);
template absl::StatusOr<std::vector<uint32_t>> Mamba2Generate<double>(
    const Mamba2Params<double>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);

}  // namespace adjsh
