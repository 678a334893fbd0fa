#include "common/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/hash.h"
#include "common/tokens.h"

namespace adjsh {

absl::StatusOr<TokenData> TokenData::Map(const std::string& path, const ReadOptions& options) {
  absl::StatusOr<int> width = TokenIdWidth(path);
  if (!width.ok()) return width.status();
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  struct stat st;
  const int stat_rc = ::fstat(fd, &st);
  const int stat_errno = errno;
  if (stat_rc != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    if (stat_rc != 0) return absl::ErrnoToStatus(stat_errno, absl::StrCat("cannot stat ", path));
    if (S_ISDIR(st.st_mode) || options.regular_only) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, S_ISDIR(st.st_mode) ? " is a directory, not a file"
                                                 : " is not a regular file (a FIFO, device "
                                                   "or socket)"));
    }
    // A pipe given on a command line cannot be mapped: read it whole.
    absl::StatusOr<std::vector<uint32_t>> ids = ReadTokenFile(path, options);
    if (!ids.ok()) return ids.status();
    TokenData data = FromIds(*std::move(ids));
    data.path_ = path;
    return data;
  }
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (bytes > options.max_bytes) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(path, " has ", bytes,
                                                     " bytes, over the limit of ",
                                                     options.max_bytes));
  }
  if (bytes % static_cast<uint64_t>(*width) != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": size ", bytes,
                                                   " bytes is not a multiple of ", *width,
                                                   " (truncated file or wrong extension?)"));
  }
  TokenData data;
  data.path_ = path;
  data.width_ = *width;
  data.size_ = static_cast<int64_t>(bytes / static_cast<uint64_t>(*width));
  if (bytes > 0) {
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    if (p == MAP_FAILED) return absl::ErrnoToStatus(map_errno, absl::StrCat("cannot map ", path));
    data.map_ = static_cast<const unsigned char*>(p);
    data.map_bytes_ = bytes;
  } else {
    ::close(fd);
  }
  return data;
}

TokenData TokenData::FromIds(std::vector<uint32_t> ids) {
  TokenData data;
  data.size_ = static_cast<int64_t>(ids.size());
  data.ids_ = std::move(ids);
  return data;
}

TokenData::TokenData(TokenData&& other) noexcept { *this = std::move(other); }

TokenData& TokenData::operator=(TokenData&& other) noexcept {
  if (this == &other) return *this;
  Release();
  ids_ = std::move(other.ids_);
  map_ = std::exchange(other.map_, nullptr);
  map_bytes_ = std::exchange(other.map_bytes_, 0);
  width_ = other.width_;
  size_ = std::exchange(other.size_, 0);
  path_ = std::move(other.path_);
  return *this;
}

TokenData::~TokenData() { Release(); }

void TokenData::Release() {
  if (map_ != nullptr) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

void TokenData::Copy(int64_t start, int64_t n, uint32_t* out) const {
  ADJSH_CHECK(start >= 0 && n >= 0 && start + n <= size_, "token range out of bounds");
  if (n == 0) return;
  if (map_ == nullptr) {
    std::copy(ids_.begin() + start, ids_.begin() + start + n, out);
    return;
  }
  const unsigned char* src = map_ + start * width_;
  if (width_ == 4) {
    std::memcpy(out, src, static_cast<size_t>(n) * 4);  // little-endian host (tensor.cc)
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t id;
      std::memcpy(&id, src + 2 * i, 2);
      out[i] = id;
    }
  }
  // Drop the pages just read from this mapping (read-only and private: the next access reads
  // them again from the page cache), so that the resident set stays that of one copy.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(src) / page * page;
  const uintptr_t hi = reinterpret_cast<uintptr_t>(src + n * width_);
  ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

std::vector<uint32_t> TokenData::Slice(int64_t start, int64_t n) const {
  std::vector<uint32_t> ids(static_cast<size_t>(n));
  Copy(start, n, ids.data());
  return ids;
}

absl::Status TokenData::CheckInVocab(int64_t vocab_size, int64_t n) const {
  const int64_t end = n < 0 ? size_ : std::min(n, size_);
  constexpr int64_t kBlock = int64_t{1} << 20;
  std::vector<uint32_t> block(static_cast<size_t>(std::min(kBlock, end)));
  for (int64_t start = 0; start < end; start += kBlock) {
    const int64_t m = std::min(kBlock, end - start);
    Copy(start, m, block.data());
    for (int64_t i = 0; i < m; ++i) {
      if (static_cast<int64_t>(block[i]) >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", block[i], " at position ",
                                                       start + i, " is not below vocab_size ",
                                                       vocab_size));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// The sampled FNV-1a of Fingerprint over `size` ids, visit(start, n, add) handing the ids of
// [start, start + n) to add(id) in order.
template <typename Visit>
std::string SampledFingerprint(int64_t size, Visit&& visit) {
  uint64_t h = kFnv1aBasis;
  auto add = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) h = Fnv1a(h, static_cast<uint8_t>(v >> (8 * b)));
  };
  add(static_cast<uint64_t>(size));
  constexpr int64_t kBlock = int64_t{1} << 20;
  const int64_t starts[3] = {0, std::max<int64_t>(0, size / 2 - kBlock / 2),
                             std::max<int64_t>(0, size - kBlock)};
  for (int64_t start : starts) visit(start, std::min(kBlock, size - start), add);
  return absl::StrCat("n:", size, ":fnv1a64:", absl::Hex(h, absl::kZeroPad16));
}

}  // namespace

std::string TokenData::Fingerprint() const {
  std::vector<uint32_t> ids;
  return SampledFingerprint(size_, [&](int64_t start, int64_t n, auto& add) {
    ids.resize(static_cast<size_t>(n));
    Copy(start, n, ids.data());
    for (uint32_t id : ids) add(id);
  });
}

std::string FingerprintBytes(std::span<const uint8_t> bytes) {
  return SampledFingerprint(static_cast<int64_t>(bytes.size()),
                            [&](int64_t start, int64_t n, auto& add) {
                              for (uint8_t b : bytes.subspan(start, n)) add(b);
                            });
}

absl::StatusOr<std::vector<int64_t>> ReadTokenOffsets(const std::string& path, int64_t limit) {
  absl::StatusOr<std::string> raw = ReadFileToString(path);
  if (!raw.ok()) return raw.status();
  if (raw->size() % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": size ", raw->size(), " bytes is not a whole number of uint64 offsets "
        "(truncated?)"));
  }
  std::vector<int64_t> offsets;
  offsets.reserve(raw->size() / 8);
  for (size_t i = 0; i < raw->size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, raw->data() + i, 8);  // little-endian host (tensor.cc)
    if (v >= static_cast<uint64_t>(limit) ||
        (!offsets.empty() && v <= static_cast<uint64_t>(offsets.back()))) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": offset ", i / 8, " (", v,
                                                     ") is out of order or past the ", limit,
                                                     " tokens"));
    }
    offsets.push_back(static_cast<int64_t>(v));
  }
  return offsets;
}

}  // namespace adjsh
