// Where the rows the engine keeps per token (the layer inputs) live: a buffer on the heap, or
// spilled to an unlinked file in a directory, memory-mapped, so that the kernel can write cold rows out
// to disk instead of holding them in memory (for contexts whose K T D numbers exceed RAM).
// The numbers are the same either way: spilling changes where they live, not their values.
// Their precision is engine/stored_rows.h's, which keeps its values in one of these.
#ifndef ADJSH_ENGINE_SPILL_BUFFER_H_
#define ADJSH_ENGINE_SPILL_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace adjsh {

template <typename T>
class SpillBuffer {
 public:
  SpillBuffer() = default;
  // n zero-initialised values; spill_dir empty: on the heap, where zeroed = false leaves them
  // uninitialised for a caller that writes every value before reading it (touching the pages
  // only then, where the writes are spread over threads).
  static absl::StatusOr<SpillBuffer> Create(size_t n, const std::string& spill_dir,
                                         bool zeroed = true);
  SpillBuffer(SpillBuffer&& other) noexcept;
  SpillBuffer& operator=(SpillBuffer&& other) noexcept;
  SpillBuffer(const SpillBuffer&) = delete;
  SpillBuffer& operator=(const SpillBuffer&) = delete;
  ~SpillBuffer();

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool spilled() const { return mapped_; }

 private:
  void Release();
  std::unique_ptr<T[]> heap_;
  T* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPILL_BUFFER_H_
