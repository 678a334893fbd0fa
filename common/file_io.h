// Whole-file reads and atomic writes, shared by the file formats in common/.
#ifndef ADJSH_COMMON_FILE_IO_H_
#define ADJSH_COMMON_FILE_IO_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace adjsh {

// The file's bytes. NOT_FOUND if it does not exist; other errno-derived codes otherwise
// (a directory gives FAILED_PRECONDITION). Messages name the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `bytes` to a temporary file in the same directory, fsyncs it, then renames it over
// `path`, so readers see either the old file or the complete new one, never a partial file.
// The temporary file is removed on failure.
absl::Status WriteFileAtomic(const std::string& path, std::string_view bytes);

}  // namespace adjsh

#endif  // ADJSH_COMMON_FILE_IO_H_
