#include "engine/mamba2_generate.h"

#include <algorithm>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokens.h"
#include "engine/mamba2_stream.h"
#include "engine/sample.h"

namespace adjsh {

template <typename T>
absl::StatusOr<std::vector<uint32_t>> Mamba2Generate(
    const Mamba2Params<T>& params, std::span<const uint32_t> prompt, const GenerateOptions& o,
    const std::function<bool(uint32_t)>& on_token) {
  const Mamba2Config& c = params.config;
  if (absl::Status s = CheckGenerateInputs(prompt, c.vocab_size, o); !s.ok()) return s;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  absl::StatusOr<Mamba2DeviceModel<T>> model = Mamba2DeviceModel<T>::Make(params, o.device);
  if (!model.ok()) return model.status();
  Mamba2Stream<T> stream(model->model);
  std::vector<T> x, last(D);
  auto feed = [&](std::span<const uint32_t> ids) {
    for (size_t i = 0; i < ids.size(); i += o.chunk) {
      const size_t n = std::min<size_t>(o.chunk, ids.size() - i);
      stream.Advance(ids.subspan(i, n), x);
      std::copy(x.end() - D, x.end(), last.begin());
    }
  };
  feed(prompt);
  return DecodeTokens<T>(
      o, V,
      [&](std::vector<T>& logits) {  // the head of the last row: rmsnorm(u; norm_f) head^T
        model->backend->HeadLogits(last.data(), 1, D, V, c.layer_norm_epsilon,
                                   params.head().data(), params.norm_f.data(), logits.data());
      },
      [&](uint32_t id) { feed(std::span(&id, 1)); }, on_token);
}

template absl::StatusOr<std::vector<uint32_t>> Mamba2Generate<float>(
    const Mamba2Params<float>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);
template absl::StatusOr<std::vector<uint32_t>> Mamba2Generate<double>(
    const Mamba2Params<double>&, std::span<const uint32_t>, const GenerateOptions&,
    const std::function<bool(uint32_t)>&);

}  // namespace adjsh
