#include "common/file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace adjsh {
namespace {

// Closes a descriptor on every return path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

absl::Status ErrnoStatus(int error, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " ", path));
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path, const ReadOptions& options) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int flags = O_RDONLY | O_CLOEXEC | (options.regular_only ? O_NONBLOCK : 0);
  Fd fd(::open(path.c_str(), flags));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is a directory, not a file"));
  }
  if (options.regular_only && !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file (a FIFO, device or socket)"));
  }
  // A pipe ends when its writer closes it; a device such as /dev/zero never ends, and was read
  // until memory ran out.
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) || S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is a device or socket, not a file or pipe"));
  }
  auto too_large = [&](uint64_t size) {
    return absl::ResourceExhaustedError(absl::StrCat(path, " has ", size,
                                                     " bytes or more, over the limit of ",
                                                     options.max_bytes));
  };
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > options.max_bytes)
    return too_large(static_cast<uint64_t>(st.st_size));
  std::string bytes;
  if (S_ISREG(st.st_mode)) bytes.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  while (true) {
    ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path);
    }
    if (n == 0) break;
    if (bytes.size() + static_cast<size_t>(n) > options.max_bytes)  // it grew, or a pipe
      return too_large(bytes.size() + static_cast<size_t>(n));
    bytes.append(buffer, static_cast<size_t>(n));
  }
  return bytes;
}

bool ProcessIsGone(int64_t pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

void RemoveStaleAtomicTemps(const std::string& dir, const std::string& base) {
  std::error_code ec;
  const std::string prefix = base + ".tmp.";
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !e.is_regular_file(ec)) continue;
    const std::string rest = name.substr(prefix.size());  // "<pid>.<n>"
    int64_t pid = 0;
    if (!absl::SimpleAtoi(rest.substr(0, rest.find('.')), &pid)) continue;
    if (ProcessIsGone(pid)) std::filesystem::remove(e.path(), ec);
  }
}

absl::Status WriteFileAtomic(const std::string& path, std::string_view bytes) {
  // Unique per process and call, so concurrent writers of the same target never share a
  // temporary file; O_EXCL guards against a stale one.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot create", tmp);
  auto fail = [&](int error, absl::string_view what) {
    ::close(fd.Release());
    ::unlink(tmp.c_str());
    return ErrnoStatus(error, what, tmp);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(errno, "cannot write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail(errno, "cannot fsync");
  if (::close(fd.Release()) != 0) {
    int error = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(error, "cannot close", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int error = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(error, "cannot rename temporary file to", path);
  }
  // Make the rename itself durable; best effort (some filesystems refuse fsync on directories).
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  Fd dir(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
  return absl::OkStatus();
}

}  // namespace adjsh
