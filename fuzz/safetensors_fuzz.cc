// Fuzz target: the safetensors reader (common/safetensors.h) on arbitrary file bytes.
// Properties: only INVALID_ARGUMENT for bad bytes; an accepted file gives valid tensors that
// serialize and parse back to the same dtypes, shapes and bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/safetensors.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<adjsh::TensorMap> tensors = adjsh::ParseSafetensors(bytes, "fuzz input");
  if (!tensors.ok()) {
    FUZZ_CHECK(tensors.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  for (const auto& [name, t] : *tensors) FUZZ_CHECK(adjsh::ValidateTensor(t).ok());
  const std::string again = adjsh::SerializeSafetensors(*tensors);
  absl::StatusOr<adjsh::TensorMap> back = adjsh::ParseSafetensors(again, "round trip");
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(back->size() == tensors->size());
  for (const auto& [name, t] : *tensors) {
    auto it = back->find(name);
    FUZZ_CHECK(it != back->end());
    FUZZ_CHECK(it->second.dtype == t.dtype && it->second.shape == t.shape &&
               it->second.data == t.data);
  }
  return 0;
}
