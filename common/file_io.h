// Whole-file reads and atomic writes, shared by the file formats in common/.
#ifndef ADJSH_COMMON_FILE_IO_H_
#define ADJSH_COMMON_FILE_IO_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace adjsh {

// What a reader accepts. The defaults take a regular file or a pipe (one given on a command
// line, as `<(cmd)`; opening a named FIFO waits for its writer, as any reader's open does), never
// a device or socket; a server reading paths it was sent uses regular_only and a max_bytes, so
// that a FIFO can neither block it (the open does not wait for a writer) nor feed it without
// end.
struct ReadOptions {
  bool regular_only = false;             // FAILED_PRECONDITION for anything but a regular file
  uint64_t max_bytes = ~uint64_t{0};     // RESOURCE_EXHAUSTED past it
};

// The file's bytes. NOT_FOUND if it does not exist; other errno-derived codes otherwise (a
// directory, device or socket gives FAILED_PRECONDITION). Messages name the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             const ReadOptions& options = {});

// Writes `bytes` to a temporary file in the same directory, fsyncs it, then renames it over
// `path`, so readers see either the old file or the complete new one, never a partial file.
// The temporary file is removed on failure.
absl::Status WriteFileAtomic(const std::string& path, std::string_view bytes);

// True when no process with this id exists (so what it left behind is no one's): the owner of a
// temporary file or directory that was killed before it could remove it.
bool ProcessIsGone(int64_t pid);

// Removes the files `dir/<base>.tmp.<pid>.<n>` that WriteFileAtomic left behind in processes
// that are gone (killed mid-write). Files of live processes are left alone.
void RemoveStaleAtomicTemps(const std::string& dir, const std::string& base);

}  // namespace adjsh

#endif  // ADJSH_COMMON_FILE_IO_H_
