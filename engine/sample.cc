#include "engine/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokens.h"

namespace adjsh {

template <typename T>
uint32_t SampleToken(const std::vector<T>& logits, const GenerateOptions& o, std::mt19937_64& rng) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (o.temperature == 0) {
    return static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int64_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  // The k largest, in decreasing logit order (ties: the lower id first), so that the draw
  // below walks a fixed order.
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double top = static_cast<double>(logits[ids[0]]);
  std::vector<double> p(k);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = std::exp((static_cast<double>(logits[ids[i]]) - top) / o.temperature);
    sum += p[i];
  }
  // A uniform in [0, 1) from 53 random bits (std::uniform_real_distribution's algorithm is
  // the library's own; this is the same on every platform).
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[i];
    if (u < acc) return static_cast<uint32_t>(ids[i]);
  }
  return static_cast<uint32_t>(ids[k - 1]);
}

absl::Status CheckGenerateInputs(std::span<const uint32_t> prompt, int64_t vocab_size,
                                 const GenerateOptions& o) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (absl::Status s = CheckTokensInVocab(prompt, vocab_size); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("prompt: ", s.message()));
  }
  if (!(o.temperature >= 0) || o.top_k < 0 || o.max_new_tokens < 0 || o.chunk < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "need temperature >= 0, top_k >= 0, max_new_tokens >= 0 and chunk >= 1 (got %g, %d, "
        "%d, %d)", o.temperature, o.top_k, o.max_new_tokens, o.chunk));
  }
  if (o.stop_id >= vocab_size) {  // it could never be drawn: a run would ignore it
    return absl::InvalidArgumentError(absl::StrFormat(
        "the stop id %d is not in the model's vocabulary of %d", o.stop_id, vocab_size));
  }
  return absl::OkStatus();
}

template <typename T>
std::vector<uint32_t> DecodeTokens(const GenerateOptions& o, int64_t vocab_size,
                                   const std::function<void(std::vector<T>&)>& logits_of_next,
                                   const std::function<void(uint32_t)>& feed,
                                   const std::function<bool(uint32_t)>& on_token) {
  std::mt19937_64 rng(o.seed);
  std::vector<T> logits(vocab_size);
  std::vector<uint32_t> out;
  while (static_cast<int64_t>(out.size()) < o.max_new_tokens) {
    logits_of_next(logits);
    const uint32_t id = SampleToken(logits, o, rng);
    out.push_back(id);
    if (on_token && !on_token(id)) break;
    if (o.stop_id >= 0 && id == o.stop_id) break;
    if (static_cast<int64_t>(out.size()) < o.max_new_tokens) feed(id);
  }
  return out;
}

template std::vector<uint32_t> DecodeTokens<float>(
    const GenerateOptions&, int64_t, const std::function<void(std::vector<float>&)>&,
    const std::function<void(uint32_t)>&, const std::function<bool(uint32_t)>&);
template std::vector<uint32_t> DecodeTokens<double>(
    const GenerateOptions&, int64_t, const std::function<void(std::vector<double>&)>&,
    const std::function<void(uint32_t)>&, const std::function<bool(uint32_t)>&);
template uint32_t SampleToken<float>(const std::vector<float>&, const GenerateOptions&,
                                     std::mt19937_64&);
template uint32_t SampleToken<double>(const std::vector<double>&, const GenerateOptions&,
                                      std::mt19937_64&);

}  // namespace adjsh
