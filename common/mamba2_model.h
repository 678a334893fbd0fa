// A Mamba-2 model's parameters (Hugging Face Mamba2ForCausalLM names and shapes), read from and
// written to model directories (config.json + model.safetensors). Shapes, with Dp = 2 Di + 2 G N
// + H the in_proj rows ([z, xBC, dt]) and Cc = Di + 2 G N the conv channels ([x, B, C]):
//   backbone.embeddings.weight (V, D)          backbone.norm_f.weight (D)
//   backbone.layers.{k}.norm.weight (D)        mixer.in_proj.weight (Dp, D)
//   mixer.conv1d.weight (Cc, 1, W)             mixer.conv1d.bias (Cc)
//   mixer.dt_bias, mixer.A_log, mixer.D (H)    mixer.norm.weight (Di)
//   mixer.out_proj.weight (D, Di)              lm_head.weight (V, D) when untied
#ifndef ADJSH_COMMON_MAMBA2_MODEL_H_
#define ADJSH_COMMON_MAMBA2_MODEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mamba2_config.h"
#include "common/model.h"
#include "common/safetensors.h"

namespace adjsh {

template <typename T>
struct Mamba2Layer {
  std::vector<T> norm;      // (D)
  std::vector<T> in_proj;   // (Dp, D)
  std::vector<T> conv_w;    // (Cc, W): HF's (Cc, 1, W)
  std::vector<T> conv_b;    // (Cc)
  std::vector<T> dt_bias;   // (H)
  std::vector<T> A_log;     // (H): A = -exp(A_log)
  std::vector<T> D;         // (H): the skip x_h D_h
  std::vector<T> gnorm;     // (Di): the gated norm's weight
  std::vector<T> out_proj;  // (D, Di)
};

template <typename T>
struct Mamba2Params {
  Mamba2Config config;
  std::vector<T> embed;    // (V, D)
  std::vector<Mamba2Layer<T>> layers;
  std::vector<T> norm_f;   // (D)
  std::vector<T> lm_head;  // (V, D) when untied; empty when tied to embed
  const std::vector<T>& head() const { return config.tie_word_embeddings ? embed : lm_head; }
};

// One layer tensor: its HF name within the layer ("mixer.in_proj.weight" of
// "backbone.layers.{k}."), its member and its shape for a config. The single list of a layer's
// tensors, in file order: the visit below and whatever walks a layer's tensors read it.
template <typename T>
struct Mamba2LayerSlot {
  const char* suffix;
  std::vector<T> Mamba2Layer<T>::*member;
  std::vector<int64_t> (*shape)(const Mamba2Config&);
};
template <typename T>
const std::vector<Mamba2LayerSlot<T>>& Mamba2LayerSlots();

// Every parameter with its HF name and shape, in file order (embedding, layers, norm_f, then
// lm_head when untied). visit returns non-OK to stop.
template <typename T>
absl::Status VisitMamba2Params(
    Mamba2Params<T>& p,
    const std::function<absl::Status(const std::string& name, const std::vector<int64_t>& shape,
                                     std::vector<T>& values)>& visit);

// The same walk as a list (common/model.h ParamRef), for code written for either model type
// (the optimizer, checkpoints, gradient combines).
template <typename T>
std::vector<ParamRef<T>> ListParams(Mamba2Params<T>& params);

// Bytes of every parameter in f32 (for a receiver's stream limits).
uint64_t Mamba2ParamBytesF32(const Mamba2Config& config);

// Zeros of every parameter's shape (a gradient's accumulator).
template <typename T>
Mamba2Params<T> ZeroMamba2Params(const Mamba2Config& config);

// From named tensors: each present with its shape (NOT_FOUND / INVALID_ARGUMENT naming the
// tensor), an untied lm_head.weight only with tie_word_embeddings false, no others.
template <typename T>
absl::StatusOr<Mamba2Params<T>> Mamba2ParamsFromTensors(const Mamba2Config& config,
                                                        const TensorMap& tensors);
template <typename T>
TensorMap Mamba2ParamsToTensors(Mamba2Params<T>& params, DType dtype);

// Writes config.json (as transformers writes it, common/mamba2_config.h) and model.safetensors
// in dtype (F32, F64 or BF16) into dir, creating it.
template <typename T>
absl::Status SaveMamba2ModelDir(const std::string& dir, const Mamba2Params<T>& params,
                                DType dtype);

// The directory's config.json and model.safetensors. Errors name the directory and the file.
template <typename T>
absl::StatusOr<Mamba2Params<T>> LoadMamba2ModelDir(const std::string& dir);

}  // namespace adjsh

#endif  // ADJSH_COMMON_MAMBA2_MODEL_H_
