// The precision of what the engine keeps from the forward pass for the backward (layer inputs,
// chunk-boundary states; where they live is engine/spill_buffer.h): the compute type T, or
// bf16 for half the bytes (f32 compute only gains; f64 stays exact unless asked). A bf16 value
// is rounded once, when it is stored, and every reader, the forward's next layer or chunk
// included, reads the same rounded number back: the gradient is then the exact gradient of the
// model that rounds at those points (the rounding's derivative taken as 1), whichever schedule
// or worker computes it. Rows may also live in a device's memory (a resident span's,
// kernels/row_space.h): there in the compute type only (a model is resident only with
// compute-type storage and no spill directory: engine/span_step.cc), read and written through
// the space.
#ifndef ADJSH_ENGINE_STORED_ROWS_H_
#define ADJSH_ENGINE_STORED_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grad_options.h"
#include "engine/spill_buffer.h"
#include "kernels/row_space.h"

namespace adjsh {

template <typename T>
class StoredRows {
 public:
  StoredRows() = default;
  // n zeros; on the heap, or spilled to spill_dir (SpillBuffer). zeroed = false: on the heap,
  // uninitialised (SpillBuffer::Create), for a caller that writes every value before reading it.
  // A space other than the host's: in its memory, compute-type storage only (checked),
  // spill_dir unused.
  static absl::StatusOr<StoredRows> Create(size_t n, Storage storage,
                                           const std::string& spill_dir, bool zeroed = true,
                                           RowSpace<T>* space = nullptr);

  // n values from offset, in the rows' space. Compute-type storage: a pointer into the store;
  // bf16: widened into scratch (resized as needed).
  const T* Read(size_t offset, size_t n, std::vector<T>& scratch) const {
    return Read(offset, n, scratch, 0, 0);
  }
  // The same, for a reader that reads next_n values from next_offset next with this scratch:
  // rows past a device's budget start coming now (RowSpace::ReadRows). Valid until the next
  // read with the same scratch.
  const T* Read(size_t offset, size_t n, std::vector<T>& scratch, size_t next_offset,
                size_t next_n) const;
  // Where to put n values for offset: the store itself, or scratch; Commit with the same
  // arguments afterwards (bf16: rounds scratch in; compute type: nothing to do).
  T* WriteBuffer(size_t offset, size_t n, std::vector<T>& scratch);
  // values: n values in the rows' space.
  void Commit(size_t offset, size_t n, const T* values);
  // values: n values in host memory (as Commit where the rows are the host's).
  void Upload(size_t offset, size_t n, const T* values);
  // n values from offset to host memory, there once the space has finished (RowSpace::Finish).
  void Download(size_t offset, size_t n, T* host) const;

  size_t size() const {
    if (device_.data()) return device_.size();
    return storage_ == Storage::kBF16 ? bf16_.size() : native_.size();
  }
  size_t bytes() const { return size() * ValueBytes(storage_); }
  static size_t ValueBytes(Storage storage) {
    return storage == Storage::kBF16 ? sizeof(uint16_t) : sizeof(T);
  }

 private:
  Storage storage_ = Storage::kCompute;
  SpillBuffer<T> native_;
  SpillBuffer<uint16_t> bf16_;
  RowBuffer<T> device_;  // a device space's rows, else empty
  RowSpace<T>* space_ = nullptr;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_STORED_ROWS_H_
