// An exclusive flock on a directory itself (no file of its own in it, so a checkpoint folder
// lists as before), held while the DirLock lives and released by the kernel however the process
// ends. A training run holds its checkpoint directory with one: two runs on one directory (two
// `adjsh train`, or jobs of two coordinators) pruned and overwrote each other's step folders.
#ifndef ADJSH_TRAIN_DIR_LOCK_H_
#define ADJSH_TRAIN_DIR_LOCK_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace adjsh::train {

class DirLock {
 public:
  DirLock() = default;
  // FAILED_PRECONDITION when another DirLock (in any process) holds `dir`, naming it; an
  // unheld DirLock where the filesystem has no flock, or `dir` cannot be opened for reading
  // (held() false: best effort).
  static absl::StatusOr<DirLock> Hold(const std::string& dir);

  DirLock(DirLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  DirLock& operator=(DirLock&& other) noexcept {
    if (this != &other) {
      Release();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock() { Release(); }

  bool held() const { return fd_ >= 0; }

 private:
  explicit DirLock(int fd) : fd_(fd) {}
  void Release();
  int fd_ = -1;
};

}  // namespace adjsh::train

#endif  // ADJSH_TRAIN_DIR_LOCK_H_
