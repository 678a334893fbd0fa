#include "engine/stored_rows.h"

#include <algorithm>
#include <utility>

#include "common/check.h"
#include "common/tensor.h"

namespace adjsh {
namespace {

uint16_t ToBF16(float v) { return F32ToBF16(v); }
uint16_t ToBF16(double v) { return F64ToBF16(v); }

}  // namespace

template <typename T>
absl::StatusOr<StoredRows<T>> StoredRows<T>::Create(size_t n, Storage storage,
                                                    const std::string& spill_dir, bool zeroed,
                                                    RowSpace<T>* space) {
  StoredRows s;
  s.storage_ = storage;
  if (space != nullptr && !space->host()) {
    ADJSH_CHECK(storage == Storage::kCompute, "resident rows are in the compute type");
    s.device_ = RowBuffer<T>(*space, n, /*may_spill=*/true);
    if (zeroed) space->Zero(s.device_.data(), n);
    s.space_ = space;
    return s;
  }
  if (storage == Storage::kBF16) {
    absl::StatusOr<SpillBuffer<uint16_t>> rows = SpillBuffer<uint16_t>::Create(n, spill_dir, zeroed);
    if (!rows.ok()) return rows.status();
    s.bf16_ = std::move(*rows);
  } else {
    absl::StatusOr<SpillBuffer<T>> rows = SpillBuffer<T>::Create(n, spill_dir, zeroed);
    if (!rows.ok()) return rows.status();
    s.native_ = std::move(*rows);
  }
  return s;
}

template <typename T>
const T* StoredRows<T>::Read(size_t offset, size_t n, std::vector<T>& scratch,
                             size_t next_offset, size_t next_n) const {
  if (device_.data()) {
    const T* rows = device_.data();
    return space_->ReadRows(rows + offset, n, &scratch, next_n ? rows + next_offset : nullptr,
                            next_n);
  }
  if (storage_ != Storage::kBF16) return native_.data() + offset;
  if (scratch.size() < n) scratch.resize(n);
  const uint16_t* src = bf16_.data() + offset;
  for (size_t i = 0; i < n; ++i) scratch[i] = static_cast<T>(BF16ToF32(src[i]));
  return scratch.data();
}

template <typename T>
T* StoredRows<T>::WriteBuffer(size_t offset, size_t n, std::vector<T>& scratch) {
  if (device_.data()) return device_.data() + offset;
  if (storage_ != Storage::kBF16) return native_.data() + offset;
  if (scratch.size() < n) scratch.resize(n);
  return scratch.data();
}

template <typename T>
void StoredRows<T>::Commit(size_t offset, size_t n, const T* values) {
  if (device_.data()) {
    space_->Copy(device_.data() + offset, values, n);
    return;
  }
  if (storage_ != Storage::kBF16) {
    T* dst = native_.data() + offset;
    if (values != dst) std::copy_n(values, n, dst);
    return;
  }
  uint16_t* dst = bf16_.data() + offset;
  for (size_t i = 0; i < n; ++i) dst[i] = ToBF16(values[i]);
}

template <typename T>
void StoredRows<T>::Upload(size_t offset, size_t n, const T* values) {
  if (device_.data()) {
    space_->Upload(device_.data() + offset, values, n);
    return;
  }
  Commit(offset, n, values);
}

template <typename T>
void StoredRows<T>::Download(size_t offset, size_t n, T* host) const {
  if (device_.data()) {
    space_->Download(host, device_.data() + offset, n);
    return;
  }
  std::vector<T> scratch;
  const T* values = Read(offset, n, scratch);
  std::copy_n(values, n, host);
}

template class StoredRows<float>;
template class StoredRows<double>;

}  // namespace adjsh
