#include "engine/generate.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokens.h"
#include "engine/layer_stream.h"
#include "engine/span_work.h"

namespace adjsh {
namespace {

// Draws an index of `logits` (V): greedy at temperature 0, else softmax(logits / temperature)
// over the top_k largest (all when 0), with one uniform draw of rng.
template <typename T>
uint32_t Sample(const std::vector<T>& logits, const GenerateOptions& o, std::mt19937_64& rng) {
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

}  // namespace

template <typename T>
absl::StatusOr<std::vector<uint32_t>> Generate(const ModelParams<T>& params,
                                               std::span<const uint32_t> prompt,
                                               const GenerateOptions& o,
                                               const std::function<bool(uint32_t)>& on_token) {
  const MambaConfig& c = params.config;
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (absl::Status s = CheckTokensInVocab(prompt, c.vocab_size); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("prompt: ", s.message()));
  }
  if (!(o.temperature >= 0) || o.top_k < 0 || o.max_new_tokens < 0 || o.chunk < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "need temperature >= 0, top_k >= 0, max_new_tokens >= 0 and chunk >= 1 (got %g, %d, "
        "%d, %d)", o.temperature, o.top_k, o.max_new_tokens, o.chunk));
  }
  // The head's logits are computed on the host (Backend::HeadLogits): the layers' forward is all
  // the device must do.
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend =
      MakeBackendFor<T>(o.device, c, {Op::kForward});
  if (!backend.ok()) return backend.status();
  const int64_t K = c.num_hidden_layers, D = c.hidden_size, H = c.conv_kernel - 1;
  const BackendModel<T> model = BackendModel<T>::Make(params, **backend);
  std::vector<LayerStream<T>> layers(K, LayerStream<T>(D, H, c.inner() * c.state_size));
  // Runs rows (embedding lookups of ids) through every layer; returns u^K of the last row.
  const int64_t C = o.chunk;
  std::vector<T> x((H + C) * D), y((H + C) * D), last(D);
  auto feed = [&](std::span<const uint32_t> ids) {
    for (size_t r0 = 0; r0 < ids.size(); r0 += C) {
      const int64_t len = std::min<int64_t>(C, static_cast<int64_t>(ids.size() - r0));
      for (int64_t t = 0; t < len; ++t) {
        const T* row = params.embed.data() + int64_t{ids[r0 + t]} * D;
        std::copy(row, row + D, x.begin() + (H + t) * D);
      }
      for (int64_t k = 0; k < K; ++k) {
        layers[k].Advance(*model.blocks[k], x.data(), len, y.data() + H * D);
        std::swap(x, y);
      }
      std::copy(x.begin() + (H + len - 1) * D, x.begin() + (H + len) * D, last.begin());
    }
  };
  std::mt19937_64 rng(o.seed);
  std::vector<T> logits(c.vocab_size);
  std::vector<uint32_t> out;
  feed(prompt);
  while (static_cast<int64_t>(out.size()) < o.max_new_tokens) {
    (*backend)->HeadLogits(last.data(), 1, D, c.vocab_size, c.layer_norm_epsilon,
                           params.head().data(), params.norm_f.data(), logits.data());
    const uint32_t id = Sample(logits, o, rng);
    out.push_back(id);
    if (on_token && !on_token(id)) break;
    if (o.stop_id >= 0 && id == o.stop_id) break;
    if (static_cast<int64_t>(out.size()) < o.max_new_tokens) feed(std::span(&out.back(), 1));
  }
  return out;
}

template absl::StatusOr<std::vector<uint32_t>> Generate<float>(
    const ModelParams<float>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);
template absl::StatusOr<std::vector<uint32_t>> Generate<double>(
    const ModelParams<double>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);

}  // namespace adjsh
