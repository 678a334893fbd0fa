#include "common/mamba2_model.h"

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/model.h"

namespace adjsh {

template <typename T>
const std::vector<Mamba2LayerSlot<T>>& Mamba2LayerSlots() {
  using L = Mamba2Layer<T>;
  using C = const Mamba2Config&;
  static const std::vector<Mamba2LayerSlot<T>> slots = {
      {"norm.weight", &L::norm, [](C c) { return std::vector<int64_t>{c.hidden_size}; }},
      {"mixer.in_proj.weight", &L::in_proj,
       [](C c) { return std::vector<int64_t>{c.in_proj_rows(), c.hidden_size}; }},
      {"mixer.conv1d.weight", &L::conv_w,
       [](C c) { return std::vector<int64_t>{c.conv_channels(), 1, c.conv_kernel}; }},
      {"mixer.conv1d.bias", &L::conv_b,
       [](C c) { return std::vector<int64_t>{c.conv_channels()}; }},
      {"mixer.dt_bias", &L::dt_bias, [](C c) { return std::vector<int64_t>{c.num_heads}; }},
      {"mixer.A_log", &L::A_log, [](C c) { return std::vector<int64_t>{c.num_heads}; }},
      {"mixer.D", &L::D, [](C c) { return std::vector<int64_t>{c.num_heads}; }},
      {"mixer.norm.weight", &L::gnorm, [](C c) { return std::vector<int64_t>{c.inner()}; }},
      {"mixer.out_proj.weight", &L::out_proj,
       [](C c) { return std::vector<int64_t>{c.hidden_size, c.inner()}; }},
  };
  return slots;
}

template <typename T>
absl::Status VisitMamba2Params(
    Mamba2Params<T>& p,
    const std::function<absl::Status(const std::string&, const std::vector<int64_t>&,
                                     std::vector<T>&)>& visit) {
  const Mamba2Config& c = p.config;
  if (absl::Status s = visit("backbone.embeddings.weight", {c.vocab_size, c.hidden_size},
                             p.embed);
      !s.ok())
    return s;
  for (size_t k = 0; k < p.layers.size(); ++k) {
    const std::string b = absl::StrCat("backbone.layers.", k, ".");
    for (const Mamba2LayerSlot<T>& slot : Mamba2LayerSlots<T>()) {
      if (absl::Status s = visit(b + slot.suffix, slot.shape(c), p.layers[k].*slot.member);
          !s.ok())
        return s;
    }
  }
  if (absl::Status s = visit("backbone.norm_f.weight", {c.hidden_size}, p.norm_f); !s.ok())
    return s;
  if (c.tie_word_embeddings) return absl::OkStatus();
  return visit(std::string(kLmHeadName), {c.vocab_size, c.hidden_size}, p.lm_head);
}

template <typename T>
std::vector<ParamRef<T>> ListParams(Mamba2Params<T>& params) {
  std::vector<ParamRef<T>> out;
  VisitMamba2Params<T>(params, [&](const std::string& name, const std::vector<int64_t>& shape,
                                   std::vector<T>& v) {
    out.push_back(ParamRef<T>{name, shape, &v});
    return absl::OkStatus();
  }).IgnoreError();
  return out;
}

uint64_t Mamba2ParamBytesF32(const Mamba2Config& c) {
  int64_t layer = 0;
  for (const Mamba2LayerSlot<float>& slot : Mamba2LayerSlots<float>())
    layer += ShapeNumel(slot.shape(c));
  const int64_t embed = c.vocab_size * c.hidden_size;
  const int64_t n = embed * (c.tie_word_embeddings ? 1 : 2) + c.hidden_size +
                    layer * c.num_hidden_layers;
  return static_cast<uint64_t>(n) * sizeof(float);
}

template <typename T>
Mamba2Params<T> ZeroMamba2Params(const Mamba2Config& config) {
  Mamba2Params<T> p;
  p.config = config;
  p.layers.resize(config.num_hidden_layers);
  VisitMamba2Params<T>(p, [](const std::string&, const std::vector<int64_t>& shape,
                             std::vector<T>& v) {
    v.assign(ShapeNumel(shape), T(0));
    return absl::OkStatus();
  }).IgnoreError();
  return p;
}

template <typename T>
absl::StatusOr<Mamba2Params<T>> Mamba2ParamsFromTensors(const Mamba2Config& config,
                                                        const TensorMap& tensors) {
  if (absl::Status s = ValidateMamba2Config(config); !s.ok()) return s;
  Mamba2Params<T> p;
  p.config = config;
  p.layers.resize(config.num_hidden_layers);
  std::set<std::string> expected;
  if (absl::Status s = TakeVisitedTensors<T>(
          tensors, [&p](auto&& f) { return VisitMamba2Params<T>(p, f); }, &expected);
      !s.ok())
    return s;
  for (const auto& [name, tensor] : tensors) {
    if (expected.contains(name)) continue;
    // An explicit LM head in a tied checkpoint duplicates the embedding; it is not used (as
    // for Mamba-1, common/model.h).
    if (name == kLmHeadName &&
        tensor.shape == std::vector<int64_t>{config.vocab_size, config.hidden_size})
      continue;
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected tensor \"", name, "\" for a Mamba-2 model of this config"));
  }
  return p;
}

template <typename T>
TensorMap Mamba2ParamsToTensors(Mamba2Params<T>& params, DType dtype) {
  TensorMap out;
  VisitMamba2Params<T>(params, [&](const std::string& name, const std::vector<int64_t>& shape,
                                   std::vector<T>& v) {
    out[name] = HostTensor::From<T>(v, shape, dtype);
    return absl::OkStatus();
  }).IgnoreError();
  return out;
}

template <typename T>
absl::Status SaveMamba2ModelDir(const std::string& dir, const Mamba2Params<T>& params,
                                DType dtype) {
  if (absl::Status s = CheckSaveDType(dtype); !s.ok()) return s;
  if (absl::Status s = ValidateMamba2Config(params.config); !s.ok()) return s;
  // The visit needs a mutable model; the tensors are copies.
  Mamba2Params<T>& p = const_cast<Mamba2Params<T>&>(params);
  return WriteModelFolder(dir, Mamba2ConfigToJson(params.config),
                          Mamba2ParamsToTensors(p, dtype));
}

template <typename T>
absl::StatusOr<Mamba2Params<T>> LoadMamba2ModelDir(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("model directory ", dir, " does not exist"));
  }
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  absl::StatusOr<std::string> text = ReadFileToString(config_path);
  if (!text.ok()) return text.status();
  absl::StatusOr<Mamba2Config> config = ParseMamba2ConfigJson(*text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(config_path, ": ", config.status().message()));
  }
  absl::StatusOr<TensorMap> tensors = ReadCheckpointTensors(dir);
  if (!tensors.ok()) return tensors.status();
  absl::StatusOr<Mamba2Params<T>> p = Mamba2ParamsFromTensors<T>(*config, *tensors);
  if (!p.ok()) {
    return absl::Status(p.status().code(), absl::StrCat(dir, ": ", p.status().message()));
  }
  return p;
}

#define ADJSH_INSTANTIATE(T)                                                                  \
  template const std::vector<Mamba2LayerSlot<T>>& Mamba2LayerSlots<T>();                      \
  template absl::Status VisitMamba2Params<T>(                                                 \
      Mamba2Params<T>&, const std::function<absl::Status(                                     \
                            const std::string&, const std::vector<int64_t>&, std::vector<T>&)>&); \
  template std::vector<ParamRef<T>> ListParams<T>(Mamba2Params<T>&);                         \
  template Mamba2Params<T> ZeroMamba2Params<T>(const Mamba2Config&);                          \
  template absl::Status SaveMamba2ModelDir<T>(const std::string&, const Mamba2Params<T>&,     \
                                              DType);                                         \
  template absl::StatusOr<Mamba2Params<T>> Mamba2ParamsFromTensors<T>(const Mamba2Config&,    \
                                                                      const TensorMap&);      \
  template TensorMap Mamba2ParamsToTensors<T>(Mamba2Params<T>&, DType);                       \
  template absl::StatusOr<Mamba2Params<T>> LoadMamba2ModelDir<T>(const std::string&);
ADJSH_INSTANTIATE(float)
ADJSH_INSTANTIATE(double)
#undef ADJSH_INSTANTIATE

}  // namespace adjsh
