// Model configuration of a Mamba-2 model: the Hugging Face Mamba2ForCausalLM config.json keys.
// Letters: D hidden, K layers, N state, W conv, E expand, Di = E D inner, P head_dim,
// H = Di / P heads, G groups (B and C are shared by the H / G heads of a group), V vocab.
#ifndef ADJSH_COMMON_MAMBA2_CONFIG_H_
#define ADJSH_COMMON_MAMBA2_CONFIG_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace adjsh {

struct Mamba2Config {
  int64_t hidden_size = 0;        // D
  int64_t num_hidden_layers = 0;  // K
  // Absent keys take transformers' Mamba2Config defaults.
  int64_t state_size = 128;       // N
  int64_t conv_kernel = 4;        // W
  int64_t expand = 2;             // E
  int64_t head_dim = 64;          // P
  int64_t num_heads = 128;        // H: H P = E D
  int64_t n_groups = 8;           // G: divides H
  int64_t vocab_size = 0;         // V
  int64_t chunk_size = 256;       // the checkpoint's SSD chunk; kept, never changes the math
  double layer_norm_epsilon = 1e-5;
  // dt after the softplus is clamped to [min, max] unless the limit is (0, inf) (mamba_ssm's
  // dt_limit; transformers' default [0.0, Infinity]).
  double time_step_min_limit = 0.0;
  double time_step_max_limit = std::numeric_limits<double>::infinity();
  bool tie_word_embeddings = false;  // transformers' Mamba2Config default
  // The source config.json's other keys (a JSON object; "" for none), written back as they
  // are (pad/bos/eos ids, time_step_min/max and the initialisation settings, ...). Among them
  // norm_before_gate: transformers' Mamba2 gates before its norm whatever the key says (its
  // default, true, included), as mamba_ssm's Mamba2 does by default; adjsh does the same
  // (docs/MATH.md "Mamba-2").
  std::string extra;

  int64_t inner() const { return expand * hidden_size; }                          // Di
  int64_t conv_channels() const { return inner() + 2 * n_groups * state_size; }  // xBC
  int64_t in_proj_rows() const { return 2 * inner() + 2 * n_groups * state_size + num_heads; }
  bool dt_clamped() const {
    return !(time_step_min_limit == 0.0 &&
             time_step_max_limit == std::numeric_limits<double>::infinity());
  }
};

// The config.json's model_type ("" when it has none); INVALID_ARGUMENT for text that is no
// JSON object.
absl::StatusOr<std::string> ModelTypeOf(std::string_view python_json_text);

// The model_type of DIR/config.json; "" when it cannot be read or has none (the model loader
// then says why).
std::string ModelTypeOfDir(const std::string& dir);

// Checks ranges and that the sizes agree (num_heads x head_dim = expand x hidden_size, n_groups
// divides num_heads) and the features adjsh implements (rms_norm, no in/out projection bias,
// a conv bias); INVALID_ARGUMENT naming the key otherwise.
absl::Status ValidateMamba2Config(const Mamba2Config& config);

// Parses and validates config.json text as transformers writes it (Infinity allowed). A
// model_type other than "mamba2" is refused by name.
absl::StatusOr<Mamba2Config> ParseMamba2ConfigJson(std::string_view python_json_text);

// config.json as transformers' Mamba2Config writes it (time_step_limit's Infinity included),
// then extra's keys.
std::string Mamba2ConfigToJson(const Mamba2Config& config);

}  // namespace adjsh

#endif  // ADJSH_COMMON_MAMBA2_CONFIG_H_
