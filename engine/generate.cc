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
#include "engine/sample.h"
#include "engine/span_work.h"

namespace adjsh {

template <typename T>
absl::StatusOr<std::vector<uint32_t>> Generate(const ModelParams<T>& params,
                                               std::span<const uint32_t> prompt,
                                               const GenerateOptions& o,
                                               const std::function<bool(uint32_t)>& on_token) {
  const MambaConfig& c = params.config;
  if (absl::Status s = CheckGenerateInputs(prompt, c.vocab_size, o); !s.ok()) return s;
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
  feed(prompt);
  return DecodeTokens<T>(
      o, c.vocab_size,
      [&](std::vector<T>& logits) {
        (*backend)->HeadLogits(last.data(), 1, D, c.vocab_size, c.layer_norm_epsilon,
                               params.head().data(), params.norm_f.data(), logits.data());
      },
      [&](uint32_t id) { feed(std::span(&id, 1)); }, on_token);
}

template absl::StatusOr<std::vector<uint32_t>> Generate<float>(
    const ModelParams<float>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);
template absl::StatusOr<std::vector<uint32_t>> Generate<double>(
    const ModelParams<double>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);

}  // namespace adjsh
