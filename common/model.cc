// Parameter table, conversions to and from named tensors, and model directories.
// Shapes: D hidden, Di = E*D inner, N state, R dt rank, W conv, K layers, V vocab.
#include "common/model.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/file_io.h"
#include "common/saturating.h"
#include "common/strings.h"

namespace adjsh {
namespace {

using Shape = std::vector<int64_t>;

// The two parameters outside the layers.
Shape EmbedShape(const MambaConfig& c) { return {c.vocab_size, c.hidden_size}; }  // (V, D)
Shape NormFShape(const MambaConfig& c) { return {c.hidden_size}; }                // (D)

// Calls f(name, shape, values) for every parameter in HF order (embedding, layers, norm_f,
// lm_head when untied), stopping at the first error. P is ModelParams<T> or const ModelParams<T>.
template <typename T, typename P, typename F>
absl::Status VisitParams(P& params, F&& f) {
  const MambaConfig& c = params.config;
  if (absl::Status s = f(std::string(kEmbedName), EmbedShape(c), params.embed); !s.ok()) return s;
  for (size_t k = 0; k < params.layers.size(); ++k) {
    for (const LayerParamSlot<T>& slot : LayerParamSlots<T>()) {
      absl::Status s = f(LayerParamName(static_cast<int64_t>(k), slot.suffix), slot.shape(c),
                         params.layers[k].*slot.member);
      if (!s.ok()) return s;
    }
  }
  if (absl::Status s = f(std::string(kNormFName), NormFShape(c), params.norm_f); !s.ok()) return s;
  if (c.tie_word_embeddings) return absl::OkStatus();
  return f(std::string(kLmHeadName), EmbedShape(c), params.lm_head);  // (V, D), as the embedding
}

absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}


}  // namespace

// model.safetensors, or the shards listed in model.safetensors.index.json (larger HF
// checkpoints are split: {"weight_map": {"tensor name": "model-00001-of-00002.safetensors"}}).
absl::StatusOr<TensorMap> ReadCheckpointTensors(const std::string& dir_path) {
  const std::filesystem::path dir(dir_path);
  const std::filesystem::path single = dir / "model.safetensors";
  const std::filesystem::path index = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(single) || !std::filesystem::exists(index)) {
    absl::StatusOr<TensorMap> t = ReadSafetensors(single.string());
    if (absl::IsNotFound(t.status())) {
      return absl::NotFoundError(absl::StrCat("model directory ", dir.string(),
                                              " has no model.safetensors"));
    }
    return t;
  }
  absl::StatusOr<std::string> text = ReadFileToString(index.string());
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](absl::string_view detail) {
    return absl::InvalidArgumentError(absl::StrCat(index.string(), ": ", detail));
  };
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return bad("not a JSON object with a \"weight_map\" object");
  }
  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it->is_string()) return bad(absl::StrCat("entry \"", it.key(), "\" is not a file name"));
    const std::string shard = it->get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard.starts_with(".")) {
      return bad(absl::StrCat("shard \"", shard, "\" is not a plain file name in the directory"));
    }
    names_by_shard[shard].push_back(it.key());
  }
  TensorMap all;
  for (const auto& [shard, names] : names_by_shard) {
    absl::StatusOr<TensorMap> part = ReadSafetensors((dir / shard).string());
    if (!part.ok()) return part.status();
    for (const std::string& name : names) {
      if (!part->contains(name)) return bad(absl::StrCat("\"", name, "\" is missing in ", shard));
    }
    for (auto& [name, tensor] : *part) {
      if (!all.emplace(name, std::move(tensor)).second) {
        return bad(absl::StrCat("tensor \"", name, "\" appears in more than one shard"));
      }
    }
  }
  return all;
}

template <typename T>
const std::vector<LayerParamSlot<T>>& LayerParamSlots() {
  using L = LayerParams<T>;
  // Never destroyed (no exit-time destructor order issues). HF order, shapes as stored.
  static const auto* const kSlots = new std::vector<LayerParamSlot<T>>{
      {"norm.weight", &L::norm, [](const MambaConfig& c) { return Shape{c.hidden_size}; }},
      {"mixer.in_proj.weight", &L::in_proj,
       [](const MambaConfig& c) { return Shape{2 * c.inner(), c.hidden_size}; }},
      // Depthwise conv: (Di, 1, W), stored as Di * W values, tap j of channel i at i*W + j.
      {"mixer.conv1d.weight", &L::conv_w,
       [](const MambaConfig& c) { return Shape{c.inner(), 1, c.conv_kernel}; }},
      {"mixer.conv1d.bias", &L::conv_b, [](const MambaConfig& c) { return Shape{c.inner()}; }},
      {"mixer.x_proj.weight", &L::x_proj,
       [](const MambaConfig& c) { return Shape{c.time_step_rank + 2 * c.state_size, c.inner()}; }},
      {"mixer.dt_proj.weight", &L::dt_w,
       [](const MambaConfig& c) { return Shape{c.inner(), c.time_step_rank}; }},
      {"mixer.dt_proj.bias", &L::dt_b, [](const MambaConfig& c) { return Shape{c.inner()}; }},
      {"mixer.A_log", &L::A_log,
       [](const MambaConfig& c) { return Shape{c.inner(), c.state_size}; }},
      {"mixer.D", &L::Dskip, [](const MambaConfig& c) { return Shape{c.inner()}; }},
      {"mixer.out_proj.weight", &L::out_proj,
       [](const MambaConfig& c) { return Shape{c.hidden_size, c.inner()}; }},
  };
  return *kSlots;
}

std::string LayerParamName(int64_t layer, const char* suffix) {
  return absl::StrCat("backbone.layers.", layer, ".", suffix);
}

template <typename T>
void SetZero(LayerParams<T>& layer, const MambaConfig& config) {
  for (const LayerParamSlot<T>& slot : LayerParamSlots<T>()) {
    (layer.*slot.member).assign(static_cast<size_t>(ShapeNumel(slot.shape(config))), T{0});
  }
}

template <typename T>
LayerParams<T> ZeroLayer(const MambaConfig& config) {
  LayerParams<T> layer;
  SetZero(layer, config);
  return layer;
}

namespace {
uint64_t SatNumel(const Shape& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n = SatMul(n, static_cast<uint64_t>(std::max<int64_t>(d, 0)));
  return n;
}
}  // namespace

uint64_t ParamBytesF32(const MambaConfig& c) {
  uint64_t layer = 0;
  for (const LayerParamSlot<float>& slot : LayerParamSlots<float>())
    layer = SatAdd(layer, SatNumel(slot.shape(c)));
  const uint64_t head = c.tie_word_embeddings ? 0 : SatNumel(EmbedShape(c));
  const uint64_t n = SatAdd(SatAdd(SatAdd(SatNumel(EmbedShape(c)), SatNumel(NormFShape(c))), head),
                            SatMul(layer, static_cast<uint64_t>(std::max<int64_t>(
                                              c.num_hidden_layers, 0))));
  return SatMul(n, sizeof(float));
}

absl::Status CheckParamsFitInMemory(uint64_t param_bytes, int copies, const std::string& what) {
  const uint64_t need = SatMul(param_bytes, static_cast<uint64_t>(copies));
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return absl::OkStatus();  // unknown: let the allocation tell
  const uint64_t have = SatMul(static_cast<uint64_t>(pages), static_cast<uint64_t>(page));
  if (need <= have) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the model (%s) needs %.1f GiB (%d f32 copies of %.1f GiB of parameters), more than this "
      "machine's %.1f GiB of memory",
      what, need / 1073741824.0, copies, param_bytes / 1073741824.0, have / 1073741824.0));
}

absl::Status CheckModelFitsInMemory(const MambaConfig& c, int copies) {
  return CheckParamsFitInMemory(
      ParamBytesF32(c), copies,
      absl::StrFormat("D=%d, K=%d, V=%d", c.hidden_size, c.num_hidden_layers, c.vocab_size));
}

template <typename T>
ModelParams<T> ZeroParams(const MambaConfig& config) {
  ModelParams<T> p;
  p.config = config;
  p.embed.assign(static_cast<size_t>(ShapeNumel(EmbedShape(config))), T{0});
  p.layers.assign(static_cast<size_t>(config.num_hidden_layers), ZeroLayer<T>(config));
  p.norm_f.assign(static_cast<size_t>(ShapeNumel(NormFShape(config))), T{0});
  if (!config.tie_word_embeddings)
    p.lm_head.assign(static_cast<size_t>(ShapeNumel(EmbedShape(config))), T{0});
  return p;
}

template <typename T>
void AddInto(LayerParams<T>& a, const LayerParams<T>& b) {
  for (const LayerParamSlot<T>& slot : LayerParamSlots<T>()) {
    std::vector<T>& x = a.*slot.member;
    const std::vector<T>& y = b.*slot.member;
    ADJSH_CHECK(x.size() == y.size(), slot.suffix);
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
}

template <typename T>
absl::Status TakeParamTensor(const TensorMap& tensors, const std::string& name,
                             const std::vector<int64_t>& shape, std::vector<T>& values) {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing tensor \"", name, "\" (expected shape ", ShapeString(shape), ")"));
  }
  if (it->second.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", name, "\" has shape ", ShapeString(it->second.shape),
        " but the config expects ", ShapeString(shape)));
  }
  absl::StatusOr<std::vector<T>> v = it->second.template To<T>();
  if (!v.ok()) return WithPrefix(v.status(), absl::StrCat("tensor \"", name, "\""));
  for (size_t i = 0; i < v->size(); ++i) {
    if (!std::isfinite((*v)[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", name, "\" has a non-finite value (", (*v)[i], ") at flat index ", i));
    }
  }
  values = *std::move(v);
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<ModelParams<T>> ParamsFromTensors(const MambaConfig& config,
                                                 const TensorMap& tensors) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  ModelParams<T> p;
  p.config = config;
  p.layers.resize(static_cast<size_t>(config.num_hidden_layers));
  std::set<std::string> expected;
  if (absl::Status s = TakeVisitedTensors<T>(
          tensors, [&p](auto&& f) { return VisitParams<T>(p, f); }, &expected);
      !s.ok())
    return s;
  for (const auto& [name, tensor] : tensors) {
    if (expected.contains(name)) continue;
    // An explicit LM head in a tied checkpoint duplicates the embedding; it is not used.
    if (name == kLmHeadName && tensor.shape == EmbedShape(config)) continue;
    if (name == kLmHeadName) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"lm_head.weight\" has shape ", ShapeString(tensor.shape),
          " but the tied embedding has shape ", ShapeString(EmbedShape(config))));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected tensor \"", name, "\" with shape ", ShapeString(tensor.shape),
                     " (not a parameter of a ", config.num_hidden_layers, "-layer Mamba)"));
  }
  return p;
}

template <typename T>
std::vector<ParamRef<T>> ListParams(ModelParams<T>& params) {
  std::vector<ParamRef<T>> out;
  VisitParams<T>(params, [&](const std::string& name, const Shape& shape,
                             std::vector<T>& values) {
    out.push_back({name, shape, &values});
    return absl::OkStatus();
  }).IgnoreError();
  return out;
}

template <typename T>
TensorMap ParamsToTensors(const ModelParams<T>& params, DType dtype) {
  TensorMap out;
  VisitParams<T>(params, [&](const std::string& name, const Shape& shape,
                             const std::vector<T>& values) {
    out.emplace(name, HostTensor::From<T>(values, shape, dtype));
    return absl::OkStatus();
  }).IgnoreError();
  return out;
}

template <typename T>
absl::StatusOr<ModelParams<T>> LoadModelDir(const std::string& dir) {
  const std::filesystem::path d(dir);
  std::error_code ec;
  if (!std::filesystem::is_directory(d, ec)) {
    if (std::filesystem::exists(d, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model path ", dir, " is not a directory (expected config.json + model.safetensors)"));
    }
    return absl::NotFoundError(absl::StrCat("model directory ", dir, " does not exist"));
  }
  const std::string config_path = (d / "config.json").string();
  absl::StatusOr<MambaConfig> config = LoadConfigFile(config_path);
  if (absl::IsNotFound(config.status())) {
    return absl::NotFoundError(absl::StrCat("model directory ", dir, " has no config.json"));
  }
  if (!config.ok()) return config.status();
  absl::StatusOr<TensorMap> tensors = ReadCheckpointTensors(dir);
  if (!tensors.ok()) return tensors.status();
  absl::StatusOr<ModelParams<T>> params = ParamsFromTensors<T>(*config, *tensors);
  if (!params.ok()) return WithPrefix(params.status(), dir);
  return params;
}

absl::Status CheckSaveDType(DType dtype) {
  if (dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kBF16)
    return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot save parameters as ", ToAbsl(DTypeName(dtype)), "; use F32, F64 or BF16"));
}

absl::Status WriteModelFolder(const std::string& dir, const std::string& config_json,
                              const TensorMap& tensors) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot create model directory ", dir));
  }
  const std::filesystem::path d(dir);
  // The new config waits beside the old one until the weights are in place: a failure on the
  // way (a full disk, a directory in the way) leaves a model that was there as it was, instead
  // of a new config.json over the old weights, and a directory made here is removed again.
  const std::string config = (d / "config.json").string(), pending = config + ".new";
  auto fail = [&](absl::Status s) {
    std::filesystem::remove(pending, ec);
    if (!existed) std::filesystem::remove(d, ec);  // only if empty
    return s;
  };
  if (absl::Status s = WriteFileAtomic(pending, config_json); !s.ok()) return fail(s);
  // transformers refuses safetensors files without {"format": "pt"} metadata.
  if (absl::Status s =
          WriteSafetensors((d / "model.safetensors").string(), tensors, {{"format", "pt"}});
      !s.ok())
    return fail(s);
  if (std::rename(pending.c_str(), config.c_str()) != 0) {
    return fail(
        absl::ErrnoToStatus(errno, absl::StrCat("cannot rename ", pending, " to ", config)));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status SaveModelDir(const std::string& dir, const ModelParams<T>& params, DType dtype) {
  if (absl::Status s = CheckSaveDType(dtype); !s.ok()) return s;
  if (absl::Status s = ValidateConfig(params.config); !s.ok()) return s;
  return WriteModelFolder(dir, ConfigToJson(params.config), ParamsToTensors(params, dtype));
}

#define ADJSH_INSTANTIATE(T)                                                                  \
  template const std::vector<LayerParamSlot<T>>& LayerParamSlots<T>();                        \
  template LayerParams<T> ZeroLayer<T>(const MambaConfig&);                                   \
  template void SetZero<T>(LayerParams<T>&, const MambaConfig&);                              \
  template ModelParams<T> ZeroParams<T>(const MambaConfig&);                                  \
  template void AddInto<T>(LayerParams<T>&, const LayerParams<T>&);                           \
  template absl::StatusOr<ModelParams<T>> ParamsFromTensors<T>(const MambaConfig&,            \
                                                               const TensorMap&);             \
  template TensorMap ParamsToTensors<T>(const ModelParams<T>&, DType);                        \
  template std::vector<ParamRef<T>> ListParams<T>(ModelParams<T>&);                          \
  template absl::StatusOr<ModelParams<T>> LoadModelDir<T>(const std::string&);                \
  template absl::Status TakeParamTensor<T>(const TensorMap&, const std::string&,              \
                                           const std::vector<int64_t>&, std::vector<T>&);     \
  template absl::Status SaveModelDir<T>(const std::string&, const ModelParams<T>&, DType);
ADJSH_INSTANTIATE(float)
ADJSH_INSTANTIATE(double)
#undef ADJSH_INSTANTIATE

}  // namespace adjsh
