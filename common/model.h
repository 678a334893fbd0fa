// Mamba causal LM parameters in the Hugging Face MambaForCausalLM layout.
// Every matrix is row-major with the shape HF stores (outermost first):
//   embed      (V, D)          backbone.embeddings.weight (also the tied LM head)
//   per layer k:
//   norm       (D)             backbone.layers.{k}.norm.weight
//   in_proj    (2*Di, D)       backbone.layers.{k}.mixer.in_proj.weight
//   conv_w     (Di, 1, W)      backbone.layers.{k}.mixer.conv1d.weight
//   conv_b     (Di)            backbone.layers.{k}.mixer.conv1d.bias
//   x_proj     (R + 2N, Di)    backbone.layers.{k}.mixer.x_proj.weight
//   dt_w       (Di, R)         backbone.layers.{k}.mixer.dt_proj.weight
//   dt_b       (Di)            backbone.layers.{k}.mixer.dt_proj.bias
//   A_log      (Di, N)         backbone.layers.{k}.mixer.A_log
//   Dskip      (Di)            backbone.layers.{k}.mixer.D
//   out_proj   (D, Di)         backbone.layers.{k}.mixer.out_proj.weight
//   norm_f     (D)             backbone.norm_f.weight
//   lm_head    (V, D)          lm_head.weight, only when tie_word_embeddings is false (an untied
//                              LM head); tied, the head is the embedding and lm_head is empty
// Gradients use the same structs.
#ifndef ADJSH_COMMON_MODEL_H_
#define ADJSH_COMMON_MODEL_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/safetensors.h"

namespace adjsh {

template <typename T>
struct LayerParams {
  std::vector<T> norm, in_proj, conv_w, conv_b, x_proj, dt_w, dt_b, A_log, Dskip, out_proj;
};

template <typename T>
struct ModelParams {
  MambaConfig config;
  std::vector<T> embed;
  std::vector<LayerParams<T>> layers;
  std::vector<T> norm_f;
  std::vector<T> lm_head;  // untied models only (config.tie_word_embeddings false)

  // The LM head's (V, D) matrix: lm_head when untied, else the embedding.
  const std::vector<T>& head() const { return config.tie_word_embeddings ? embed : lm_head; }
  std::vector<T>& head() { return config.tie_word_embeddings ? embed : lm_head; }
};

// One row of the parameter table: the HF name suffix within a layer (or the global name), its
// shape for a config, and the member it lives in. The single source of names and shapes.
template <typename T>
struct LayerParamSlot {
  const char* suffix;  // e.g. "mixer.in_proj.weight"
  std::vector<T> LayerParams<T>::*member;
  std::vector<int64_t> (*shape)(const MambaConfig&);
};
template <typename T>
const std::vector<LayerParamSlot<T>>& LayerParamSlots();

std::string LayerParamName(int64_t layer, const char* suffix);  // "backbone.layers.{k}.{suffix}"
inline constexpr const char* kEmbedName = "backbone.embeddings.weight";
inline constexpr const char* kNormFName = "backbone.norm_f.weight";
inline constexpr const char* kLmHeadName = "lm_head.weight";

// Every parameter tensor of a model in HF order (embedding, layers, norm_f, and lm_head when
// untied), by reference: the
// way to walk several same-config models (parameters, gradients, optimizer moments) in step.
template <typename T>
struct ParamRef {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<T>* values;
};
template <typename T>
std::vector<ParamRef<T>> ListParams(ModelParams<T>& params);

// Bytes of every parameter of the model in f32 (saturating at UINT64_MAX: never overflows,
// whatever the config's sizes): what a copy of the model, a gradient or one AdamW moment holds.
uint64_t ParamBytesF32(const MambaConfig& config);

// OK when `copies` f32 copies of the model fit in this machine's physical memory; else
// RESOURCE_EXHAUSTED naming the bytes (refused before any allocation is tried).
absl::Status CheckModelFitsInMemory(const MambaConfig& config, int copies);
// The same for a model of `param_bytes` f32 parameter bytes, named `what` in the message
// (a Mamba-2 model's: common/mamba2_model.h Mamba2ParamBytesF32).
absl::Status CheckParamsFitInMemory(uint64_t param_bytes, int copies, const std::string& what);

// All parameters sized for `config`, filled with zeros (a gradient accumulator).
template <typename T>
ModelParams<T> ZeroParams(const MambaConfig& config);
template <typename T>
LayerParams<T> ZeroLayer(const MambaConfig& config);
// The same in place: `layer` sized for `config` and zeroed, keeping its buffers' capacity (an
// accumulator reused from task to task).
template <typename T>
void SetZero(LayerParams<T>& layer, const MambaConfig& config);

// a += b, element by element, member by member (same config).
template <typename T>
void AddInto(LayerParams<T>& a, const LayerParams<T>& b);

// Builds parameters from named tensors: every expected name present with its exact shape, no
// unexpected names ("lm_head.weight" is a parameter when tie_word_embeddings is false; in a tied
// checkpoint one equal in shape to the embedding is accepted and ignored). Errors name the
// tensor and both shapes.
template <typename T>
absl::StatusOr<ModelParams<T>> ParamsFromTensors(const MambaConfig& config, const TensorMap& tensors);

// Named tensors of `dtype` (kF32, kF64 or kBF16), HF names and shapes.
template <typename T>
TensorMap ParamsToTensors(const ModelParams<T>& params, DType dtype);

// tensors[name] as T into values: INVALID_ARGUMENT naming the tensor when it is missing, of
// another shape than `shape`, not a float tensor, or holds a NaN or infinity.
template <typename T>
absl::Status TakeParamTensor(const TensorMap& tensors, const std::string& name,
                             const std::vector<int64_t>& shape, std::vector<T>& values);

// Every parameter a visit walks (visit(f) calls f(name, shape, values) for each, either model
// type's), taken from tensors by TakeParamTensor; *taken gets their names, so that the caller
// can refuse the tensors no parameter took.
template <typename T, typename Visit>
absl::Status TakeVisitedTensors(const TensorMap& tensors, Visit&& visit,
                                std::set<std::string>* taken) {
  return visit([&](const std::string& name, const std::vector<int64_t>& shape,
                   std::vector<T>& values) -> absl::Status {
    taken->insert(name);
    return TakeParamTensor<T>(tensors, name, shape, values);
  });
}

// A model directory's tensors: model.safetensors, or the shards listed in
// model.safetensors.index.json (larger HF checkpoints are split). NOT_FOUND naming the
// directory when it has neither.
absl::StatusOr<TensorMap> ReadCheckpointTensors(const std::string& dir);

// A model directory holds config.json and model.safetensors.
template <typename T>
absl::StatusOr<ModelParams<T>> LoadModelDir(const std::string& dir);
template <typename T>
absl::Status SaveModelDir(const std::string& dir, const ModelParams<T>& params, DType dtype);

// OK for F32, F64 and BF16 (what a model folder is saved in); INVALID_ARGUMENT naming another.
absl::Status CheckSaveDType(DType dtype);
// A model folder of either type: config_json as config.json and tensors as model.safetensors
// (with the {"format": "pt"} metadata transformers requires), dir created.
absl::Status WriteModelFolder(const std::string& dir, const std::string& config_json,
                              const TensorMap& tensors);

// Mamba's published initialisation (deterministic for a seed): A_log = log(1..N) per row, D = 1,
// dt_proj bias = inverse softplus of dt ~ logUniform(1e-3, 1e-1), dt_proj weight uniform in
// +-R^-0.5, other matrices normal with std 0.02 (out_proj rescaled by 1/sqrt(K)), norms 1.
template <typename T>
ModelParams<T> InitParams(const MambaConfig& config, uint64_t seed);

}  // namespace adjsh

#endif  // ADJSH_COMMON_MODEL_H_
