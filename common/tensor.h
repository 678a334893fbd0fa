// Tensors as stored and sent: a dtype, a shape (outermost first) and raw little-endian bytes.
// Compute code works on std::vector<T> (T = float or double); HostTensor is the boundary type for
// files (safetensors) and, later, the wire.
#ifndef ADJSH_COMMON_TENSOR_H_
#define ADJSH_COMMON_TENSOR_H_

#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace adjsh {

enum class DType { kF32, kF64, kBF16, kF16, kI32, kI64, kU8 };

// Safetensors spelling: "F32", "F64", "BF16", "F16", "I32", "I64", "U8".
std::string_view DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(std::string_view name);
int64_t DTypeSize(DType dtype);

// bf16 <-> f32: bf16 is the top half of an f32; conversion rounds to nearest even, NaN kept NaN.
// Inline: the engine rounds every stored row through these.
inline uint16_t F32ToBF16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // NaN: keep the sign and the top payload bits, and force a quiet bit so that truncation
  // cannot turn the NaN into an infinity.
  if (value != value) return static_cast<uint16_t>((bits >> 16) | 0x0040);
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. Overflow past the
  // largest finite bf16 carries into the exponent and yields infinity, as it should.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
inline float BF16ToF32(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}
// double -> bf16 with a single rounding (not through a nearest-rounded float).
uint16_t F64ToBF16(double value);
float F16ToF32(uint16_t bits);

struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // numel() * DTypeSize(dtype) bytes, little-endian

  int64_t numel() const;

  // Builds a tensor of `dtype` from values, converting (f32/f64/bf16 only). Aborts (ADJSH_CHECK)
  // on a programming error: values.size() != numel of `shape`, or another dtype.
  template <typename T>
  static HostTensor From(std::span<const T> values, std::vector<int64_t> shape, DType dtype);

  // Converts a floating tensor (f32, f64, bf16, f16) to T. INVALID_ARGUMENT for integer dtypes.
  template <typename T>
  absl::StatusOr<std::vector<T>> To() const;
};

std::string ShapeString(std::span<const int64_t> shape);  // "(2, 3)"; a scalar is "()"

// Product of the dims (1 for a scalar); no overflow check, callers validate dims first.
int64_t ShapeNumel(std::span<const int64_t> shape);

// OK when every dim is >= 0 and data holds exactly numel() * DTypeSize(dtype) bytes;
// INVALID_ARGUMENT otherwise.
absl::Status ValidateTensor(const HostTensor& tensor);

}  // namespace adjsh

#endif  // ADJSH_COMMON_TENSOR_H_
