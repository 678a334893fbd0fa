#include "engine/generate.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokens.h"
#include "engine/model_stream.h"
#include "engine/sample.h"

namespace adjsh {

namespace {

// Decoding through a model's streams (engine/model_stream.h), either model type.
template <typename Streams>
absl::StatusOr<std::vector<uint32_t>> GenerateWith(const typename Streams::Params& params,
                                                   std::span<const uint32_t> prompt,
                                                   const GenerateOptions& o,
                                                   const std::function<bool(uint32_t)>& on_token) {
  using T = typename Streams::Value;
  const auto& c = params.config;
  if (absl::Status s = CheckGenerateInputs(prompt, c.vocab_size, o); !s.ok()) return s;
  // The head's logits are computed on the host (Backend::HeadLogits): the layers' forward is all
  // the device must do.
  absl::StatusOr<Streams> streams = Streams::Make(params, o.device, /*head=*/false);
  if (!streams.ok()) return streams.status();
  const int64_t K = c.num_hidden_layers, D = c.hidden_size, H = streams->halo();
  // Runs rows (embedding lookups of ids) through every layer; keeps u^K of the last row.
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
        streams->Advance(k, x.data(), len, y.data() + H * D);
        std::swap(x, y);
      }
      std::copy(x.begin() + (H + len - 1) * D, x.begin() + (H + len) * D, last.begin());
    }
  };
  feed(prompt);
  return DecodeTokens<T>(
      o, c.vocab_size,
      [&](std::vector<T>& logits) {  // the head of the last row: rmsnorm(u; norm_f) head^T
        streams->backend().HeadLogits(last.data(), 1, D, c.vocab_size, c.layer_norm_epsilon,
                                      params.head().data(), params.norm_f.data(), logits.data());
      },
      [&](uint32_t id) { feed(std::span(&id, 1)); }, on_token);
}

}  // namespace

template <typename T>
absl::StatusOr<std::vector<uint32_t>> Generate(const ModelParams<T>& params,
                                               std::span<const uint32_t> prompt,
                                               const GenerateOptions& o,
                                               const std::function<bool(uint32_t)>& on_token) {
  return GenerateWith<ModelStreams<ModelParams<T>>>(params, prompt, o, on_token);
}

template <typename T>
absl::StatusOr<std::vector<uint32_t>> Generate(const Mamba2Params<T>& params,
                                               std::span<const uint32_t> prompt,
                                               const GenerateOptions& o,
                                               const std::function<bool(uint32_t)>& on_token) {
  return GenerateWith<ModelStreams<Mamba2Params<T>>>(params, prompt, o, on_token);
}

template absl::StatusOr<std::vector<uint32_t>> Generate<float>(
    const ModelParams<float>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);
template absl::StatusOr<std::vector<uint32_t>> Generate<double>(
    const ModelParams<double>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);
template absl::StatusOr<std::vector<uint32_t>> Generate<float>(
    const Mamba2Params<float>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);
template absl::StatusOr<std::vector<uint32_t>> Generate<double>(
    const Mamba2Params<double>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);

}  // namespace adjsh
