// The model-shape flags shared by `adjsh init` and `adjsh train`.
#ifndef ADJSH_CLI_MODEL_FLAGS_H_
#define ADJSH_CLI_MODEL_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "cli/args.h"
#include "common/config.h"
#include "common/mamba2_config.h"

namespace adjsh::cli {

struct ModelFlagDefaults {
  std::string hidden_size, layers, vocab_size;  // empty: required
};

void AddModelFlags(ArgParser& a, const ModelFlagDefaults& defaults);

// A validated config from the flags; INVALID_ARGUMENT naming the flag or key otherwise.
absl::StatusOr<MambaConfig> ConfigFromFlags(const ArgParser& a);

// `adjsh init`'s Mamba-2 flags: --head-dim P and --groups G (H = E D / P heads).
void AddMamba2Flags(ArgParser& a);
// A validated Mamba-2 config from the shape flags (--dt-rank must stay auto: Mamba-2 has no dt
// projection) and the Mamba-2 flags; INVALID_ARGUMENT naming the flag or key otherwise.
absl::StatusOr<Mamba2Config> Mamba2ConfigFromFlags(const ArgParser& a);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_MODEL_FLAGS_H_
