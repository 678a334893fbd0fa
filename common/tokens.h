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
#include "common/file_io.h"

namespace adjsh {

// Bytes per id of a token file's name: 4 for .u32, 2 for .u16; INVALID_ARGUMENT otherwise.
absl::StatusOr<int> TokenIdWidth(const std::string& path);

// INVALID_ARGUMENT for an unknown extension or a size that is not a whole number of ids;
// NOT_FOUND for a missing file.
absl::StatusOr<std::vector<uint32_t>> ReadTokenFile(const std::string& path,
                                                    const ReadOptions& options = {});
absl::Status WriteTokenFile(const std::string& path, std::span<const uint32_t> tokens);

// INVALID_ARGUMENT naming the first position whose id is >= vocab_size.
absl::Status CheckTokensInVocab(std::span<const uint32_t> tokens, int64_t vocab_size);

// A loss mask for a sequence of T tokens (the target at t counts iff mask[t] != 0; mask[0] has
// no target): empty (every target counts) or T entries counting at least one target;
// INVALID_ARGUMENT saying which otherwise.
absl::Status CheckLossMask(std::span<const uint8_t> mask, int64_t T);
// The next-token targets a mask counts: T - 1 when it is empty.
int64_t CountedTargets(std::span<const uint8_t> mask, int64_t T);
// Whether a non-empty mask counts a target (CountedTargets > 0), reading only up to the first
// it counts.
bool CountsATarget(std::span<const uint8_t> mask);

// Byte-level tokens (id = byte value, vocabulary 256) of text files, concatenated in order.
// NOT_FOUND naming a missing file; INVALID_ARGUMENT when the result is empty.
absl::StatusOr<std::vector<uint32_t>> ReadTextAsBytes(std::span<const std::string> paths,
                                                      const ReadOptions& options = {});

// The built-in corpus: the license texts every Debian machine has, /usr/share/common-licenses
// (regular files only, in name order).
std::vector<std::string> BuiltinCorpusFiles();

}  // namespace adjsh

#endif  // ADJSH_COMMON_TOKENS_H_
