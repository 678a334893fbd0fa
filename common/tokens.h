// Token files: raw little-endian token ids, `.u32` (uint32) or `.u16` (uint16), chosen by the
// file extension.
#ifndef ADJSH_COMMON_TOKENS_H_
#define ADJSH_COMMON_TOKENS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace adjsh {

// INVALID_ARGUMENT for an unknown extension or a size that is not a whole number of ids;
// NOT_FOUND for a missing file.
absl::StatusOr<std::vector<uint32_t>> ReadTokenFile(const std::string& path);
absl::Status WriteTokenFile(const std::string& path, std::span<const uint32_t> tokens);

// INVALID_ARGUMENT naming the first position whose id is >= vocab_size.
absl::Status CheckTokensInVocab(std::span<const uint32_t> tokens, int64_t vocab_size);

}  // namespace adjsh

#endif  // ADJSH_COMMON_TOKENS_H_
