#include "engine/spill_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace adjsh {

template <typename T>
absl::StatusOr<SpillBuffer<T>> SpillBuffer<T>::Create(size_t n, const std::string& spill_dir,
                                                bool zeroed) {
  SpillBuffer s;
  s.size_ = n;
  if (spill_dir.empty() || n == 0) {
    s.heap_.reset(zeroed ? new T[n]() : new T[n]);
    s.data_ = s.heap_.get();
    return s;
  }
  std::string path = spill_dir + "/adjsh-rows-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a spill file in ", spill_dir, ": ", std::strerror(errno)));
  }
  unlink(path.c_str());  // the file goes away with the mapping, whatever happens to the process
  const size_t bytes = n * sizeof(T);
  // Reserve the blocks now: a full disk is an error here, not a SIGBUS on a later write.
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size a spill file of ", bytes, " bytes in ", spill_dir, ": ",
                     std::strerror(err)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map a spill file of ", bytes,
                                                     " bytes: ", std::strerror(errno)));
  }
  s.data_ = static_cast<T*>(p);  // a new file reads as zeros
  s.mapped_ = true;
  return s;
}

template <typename T>
SpillBuffer<T>::SpillBuffer(SpillBuffer&& o) noexcept
    : heap_(std::move(o.heap_)), data_(o.data_), size_(o.size_), mapped_(o.mapped_) {
  o.data_ = nullptr, o.size_ = 0, o.mapped_ = false;
}

template <typename T>
SpillBuffer<T>& SpillBuffer<T>::operator=(SpillBuffer&& o) noexcept {
  if (this != &o) {
    Release();
    heap_ = std::move(o.heap_);
    data_ = o.data_, size_ = o.size_, mapped_ = o.mapped_;
    o.data_ = nullptr, o.size_ = 0, o.mapped_ = false;
  }
  return *this;
}

template <typename T>
void SpillBuffer<T>::Release() {
  if (mapped_ && data_) munmap(data_, size_ * sizeof(T));
  heap_.reset();
  data_ = nullptr, size_ = 0, mapped_ = false;
}

template <typename T>
SpillBuffer<T>::~SpillBuffer() {
  Release();
}

template class SpillBuffer<float>;
template class SpillBuffer<double>;
template class SpillBuffer<uint16_t>;  // bf16 storage

}  // namespace adjsh
