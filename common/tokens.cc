// Token files: raw little-endian uint32 (.u32) or uint16 (.u16) ids, no header.
#include "common/tokens.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"

namespace adjsh {
absl::StatusOr<int> TokenIdWidth(const std::string& path) {
  if (absl::EndsWith(path, ".u32")) return 4;
  if (absl::EndsWith(path, ".u16")) return 2;
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": unknown token file extension; expected .u32 (uint32) or .u16 (uint16)"));
}

absl::StatusOr<std::vector<uint32_t>> ReadTokenFile(const std::string& path,
                                                    const ReadOptions& options) {
  absl::StatusOr<int> width = TokenIdWidth(path);
  if (!width.ok()) return width.status();
  absl::StatusOr<std::string> bytes = ReadFileToString(path, options);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() % static_cast<size_t>(*width) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": size ", bytes->size(),
                                                   " bytes is not a multiple of ", *width,
                                                   " (truncated file or wrong extension?)"));
  }
  std::vector<uint32_t> tokens(bytes->size() / static_cast<size_t>(*width));
  for (size_t i = 0; i < tokens.size(); ++i) {  // little-endian host (see tensor.cc)
    if (*width == 4) {
      std::memcpy(&tokens[i], bytes->data() + 4 * i, 4);
    } else {
      uint16_t id;
      std::memcpy(&id, bytes->data() + 2 * i, 2);
      tokens[i] = id;
    }
  }
  return tokens;
}

absl::Status WriteTokenFile(const std::string& path, std::span<const uint32_t> tokens) {
  absl::StatusOr<int> width = TokenIdWidth(path);
  if (!width.ok()) return width.status();
  std::string bytes;
  bytes.reserve(tokens.size() * static_cast<size_t>(*width));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (*width == 4) {
      bytes.append(reinterpret_cast<const char*>(&tokens[i]), 4);
    } else {
      if (tokens[i] > 0xffff) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": token ", tokens[i],
                                                       " at position ", i,
                                                       " does not fit in uint16; use .u32"));
      }
      uint16_t id = static_cast<uint16_t>(tokens[i]);
      bytes.append(reinterpret_cast<const char*>(&id), 2);
    }
  }
  return WriteFileAtomic(path, bytes);
}

absl::Status CheckTokensInVocab(std::span<const uint32_t> tokens, int64_t vocab_size) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (static_cast<int64_t>(tokens[i]) >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at position ", i,
                                                     " is not below vocab_size ", vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLossMask(std::span<const uint8_t> mask, int64_t T) {
  if (mask.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(mask.size()) != T) {
    return absl::InvalidArgumentError(
        absl::StrCat("the loss mask has ", mask.size(), " entries for ", T, " tokens"));
  }
  if (!CountsATarget(mask))
    return absl::InvalidArgumentError("the loss mask counts no target (all zero after token 0)");
  return absl::OkStatus();
}

int64_t CountedTargets(std::span<const uint8_t> mask, int64_t T) {
  if (mask.empty()) return T - 1;
  return std::count_if(mask.begin() + 1, mask.end(), [](uint8_t m) { return m != 0; });
}

bool CountsATarget(std::span<const uint8_t> mask) {
  return mask.size() > 1 &&
         std::any_of(mask.begin() + 1, mask.end(), [](uint8_t m) { return m != 0; });
}

absl::StatusOr<std::vector<uint32_t>> ReadTextAsBytes(std::span<const std::string> paths,
                                                      const ReadOptions& options) {
  std::vector<uint32_t> tokens;
  for (const std::string& path : paths) {
    ReadOptions rest = options;  // max_bytes bounds all the files together
    rest.max_bytes = options.max_bytes - std::min<uint64_t>(options.max_bytes, tokens.size());
    absl::StatusOr<std::string> text = ReadFileToString(path, rest);
    if (!text.ok()) return text.status();
    tokens.reserve(tokens.size() + text->size());
    for (char c : *text) tokens.push_back(static_cast<unsigned char>(c));
  }
  if (tokens.empty()) return absl::InvalidArgumentError("the text input is empty");
  return tokens;
}

std::vector<std::string> BuiltinCorpusFiles() {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses", ec)) {
    if (e.is_regular_file(ec) && !e.is_symlink(ec)) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace adjsh
