// Model configuration: the Hugging Face MambaForCausalLM config.json keys (docs/ARCHITECTURE.md
// "Data, evaluation and decoding").
// Letters used across the code: D hidden, K layers, N state, W conv, E expand, Di = E*D inner,
// R dt rank, V vocab.
#ifndef ADJSH_COMMON_CONFIG_H_
#define ADJSH_COMMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace adjsh {

struct MambaConfig {
  int64_t hidden_size = 0;        // D
  int64_t num_hidden_layers = 0;  // K
  int64_t state_size = 16;        // N
  int64_t conv_kernel = 4;        // W
  int64_t expand = 2;             // E
  int64_t time_step_rank = 0;     // R ("auto" in JSON resolves to ceil(D / 16))
  int64_t vocab_size = 0;         // V
  double layer_norm_epsilon = 1e-5;
  bool use_bias = false;
  bool use_conv_bias = true;
  bool tie_word_embeddings = true;
  // The source config.json's other keys (a JSON object; "" for none), kept so that a model
  // written back carries them: pad/bos/eos ids, torch_dtype, the initialisation settings and
  // any key adjsh does not use. They never change the computation.
  std::string extra;

  int64_t inner() const { return expand * hidden_size; }  // Di
};

// Checks ranges and the features adjsh supports (use_bias = false, use_conv_bias = true; the
// LM head tied to the embedding or untied, lm_head.weight); INVALID_ARGUMENT naming the key
// otherwise.
absl::Status ValidateConfig(const MambaConfig& config);

// Parses and validates config.json text. A model_type other than "mamba" (the one adjsh
// implements), or a hidden_act other than "silu", is refused by name; keys adjsh does not use
// are kept in extra.
absl::StatusOr<MambaConfig> ParseConfigJson(std::string_view json_text);
absl::StatusOr<MambaConfig> LoadConfigFile(const std::string& path);

// HF-compatible config.json ("model_type": "mamba", "architectures": ["MambaForCausalLM"]):
// the shape's keys, then extra's (which replace adjsh's defaults for pad/bos/eos ids, ...).
std::string ConfigToJson(const MambaConfig& config);

// The shape alone (ConfigToJson without extra): what two models must share to be the same
// architecture (a resumed checkpoint, a gradient's parameters).
std::string ShapeJson(const MambaConfig& config);

}  // namespace adjsh

#endif  // ADJSH_COMMON_CONFIG_H_
