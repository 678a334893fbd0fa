#include "train/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace adjsh::train {

absl::StatusOr<DirLock> DirLock::Hold(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 && errno == EACCES) return DirLock();  // writable, not readable: unheld
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the checkpoint directory ", dir, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd);
    if (error == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint directory ", dir, " is in use by another training run: two runs "
          "would overwrite each other's checkpoints; wait for it to end, or choose another "
          "checkpoint directory"));
    }
    return DirLock();  // no flock here (ENOLCK, EINVAL): unheld, as before
  }
  return DirLock(fd);
}

void DirLock::Release() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
  fd_ = -1;
}

}  // namespace adjsh::train
