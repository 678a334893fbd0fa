// Fuzz target: the config.json parser (common/config.h) on arbitrary text.
// Properties: only INVALID_ARGUMENT for bad text; an accepted config passes ValidateConfig and
// survives ConfigToJson -> ParseConfigJson unchanged.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/config.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<adjsh::MambaConfig> c = adjsh::ParseConfigJson(text);
  if (!c.ok()) {
    FUZZ_CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(adjsh::ValidateConfig(*c).ok());
  absl::StatusOr<adjsh::MambaConfig> back = adjsh::ParseConfigJson(adjsh::ConfigToJson(*c));
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(back->hidden_size == c->hidden_size &&
             back->num_hidden_layers == c->num_hidden_layers &&
             back->state_size == c->state_size && back->conv_kernel == c->conv_kernel &&
             back->expand == c->expand && back->time_step_rank == c->time_step_rank &&
             back->vocab_size == c->vocab_size &&
             back->layer_norm_epsilon == c->layer_norm_epsilon && back->use_bias == c->use_bias &&
             back->use_conv_bias == c->use_conv_bias &&
             back->tie_word_embeddings == c->tie_word_embeddings);
  return 0;
}
