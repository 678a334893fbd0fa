// Safetensors files: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the tensor bytes. The reader validates everything a corrupt or truncated file can get
// wrong (header length, JSON, dtypes, offsets in bounds and consistent with shape) and reports
// it as INVALID_ARGUMENT / NOT_FOUND naming the file and the tensor; it never crashes.
#ifndef ADJSH_COMMON_SAFETENSORS_H_
#define ADJSH_COMMON_SAFETENSORS_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace adjsh {

using TensorMap = std::map<std::string, HostTensor>;

absl::StatusOr<TensorMap> ReadSafetensors(const std::string& path);
absl::StatusOr<TensorMap> ParseSafetensors(std::string_view bytes, std::string_view what);

// Writes atomically (a temporary file beside `path`, then rename). Tensors in name order.
absl::Status WriteSafetensors(const std::string& path, const TensorMap& tensors,
                              const std::map<std::string, std::string>& metadata = {});
std::string SerializeSafetensors(const TensorMap& tensors,
                                 const std::map<std::string, std::string>& metadata = {});

}  // namespace adjsh

#endif  // ADJSH_COMMON_SAFETENSORS_H_
