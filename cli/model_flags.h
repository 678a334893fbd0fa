// The model-shape flags shared by `adjsh init` and `adjsh train`.
#ifndef ADJSH_CLI_MODEL_FLAGS_H_
#define ADJSH_CLI_MODEL_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "cli/args.h"
#include "common/config.h"

namespace adjsh::cli {

struct ModelFlagDefaults {
  std::string hidden_size, layers, vocab_size;  // empty: required
};

void AddModelFlags(ArgParser& a, const ModelFlagDefaults& defaults);

// A validated config from the flags; INVALID_ARGUMENT naming the flag or key otherwise.
absl::StatusOr<MambaConfig> ConfigFromFlags(const ArgParser& a);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_MODEL_FLAGS_H_
