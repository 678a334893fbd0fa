// A corpus of token ids for training and evaluation: a token file (.u16 / .u32, common/tokens.h)
// mapped read-only, or ids held in memory (text read as bytes). A mapped file is never read
// whole: each copy touches only the pages of the ids it copies and then drops them from the
// process's mapping (the page cache keeps them for the next reader), so resident memory does
// not grow with the file.
#ifndef ADJSH_COMMON_TOKEN_DATA_H_
#define ADJSH_COMMON_TOKEN_DATA_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_io.h"

namespace adjsh {

class TokenData {
 public:
  TokenData() = default;
  // The ids of a token file, mapped. INVALID_ARGUMENT for an unknown extension or a size that
  // is not a whole number of ids; NOT_FOUND for a missing file; options as for a whole read
  // (regular_only, max_bytes: the file's size).
  static absl::StatusOr<TokenData> Map(const std::string& path, const ReadOptions& options = {});
  // Ids in memory.
  static TokenData FromIds(std::vector<uint32_t> ids);

  TokenData(TokenData&& other) noexcept;
  TokenData& operator=(TokenData&& other) noexcept;
  TokenData(const TokenData&) = delete;
  TokenData& operator=(const TokenData&) = delete;
  ~TokenData();

  int64_t size() const { return size_; }
  bool mapped() const { return map_ != nullptr; }
  const std::string& path() const { return path_; }  // empty for ids in memory

  // Ids [start, start + n) into out (0 <= start, start + n <= size(): checked). Thread-safe.
  void Copy(int64_t start, int64_t n, uint32_t* out) const;
  std::vector<uint32_t> Slice(int64_t start, int64_t n) const;

  // INVALID_ARGUMENT naming the first position whose id is >= vocab_size, among the first `n`
  // ids (-1: all of them; one pass, in blocks).
  absl::Status CheckInVocab(int64_t vocab_size, int64_t n = -1) const;

  // "n:<size>:fnv1a64:<16 hex digits>", FNV-1a over the size and the ids of three blocks of up
  // to 1M ids (the first, the middle and the last): what a resumed run checks it trains on the
  // same data (different sizes or contents there differ; it reads at most 12 MiB).
  std::string Fingerprint() const;

 private:
  void Release();
  std::vector<uint32_t> ids_;   // in memory
  const unsigned char* map_ = nullptr;  // mapped: the file's bytes
  size_t map_bytes_ = 0;
  int width_ = 4;               // bytes per id in the file
  int64_t size_ = 0;
  std::string path_;
};

// Fingerprint() of bytes taken as ids (a loss mask: one byte per token), without a copy.
std::string FingerprintBytes(std::span<const uint8_t> bytes);

// A file of token offsets (a document index, `adjsh grad --doc-starts`): raw little-endian
// uint64, strictly increasing, each below `limit`. INVALID_ARGUMENT naming the file for a size
// that is not a whole number of them or an offset out of order or past the limit; the read's
// errors.
absl::StatusOr<std::vector<int64_t>> ReadTokenOffsets(const std::string& path, int64_t limit);

}  // namespace adjsh

#endif  // ADJSH_COMMON_TOKEN_DATA_H_
