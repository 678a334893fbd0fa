// Dtype names and sizes, bf16/f16 conversion, HostTensor <-> std::vector<T>.
// Host byte order is little-endian (x86-64, aarch64), so tensor bytes are copied as they are.
#include "common/tensor.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/strings.h"

namespace adjsh {

static_assert(std::endian::native == std::endian::little,
              "tensor bytes are little-endian; a big-endian host needs byte swapping here");

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                  DType::kU8}) {
    if (DTypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported dtype \"", ToAbsl(name), "\" (supported: F32, F64, BF16, F16, I32, I64, U8)"));
}

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kU8: return 1;
  }
  return 0;
}

float F16ToF32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits >> 15) << 31;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) {  // infinity or NaN (payload kept)
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

// double -> bf16 with a single rounding. Going through a nearest-rounded float can round twice
// (1 + 2^-8 + 2^-30 would become the tie 1 + 2^-8, then 1.0); rounding to float "to odd"
// (truncate, then set the last bit if anything was lost) keeps the information the final
// nearest-even rounding needs.
uint16_t F64ToBF16(double value) {
  if (std::isnan(value)) return F32ToBF16(static_cast<float>(value));
  float f = static_cast<float>(value);
  const double back = static_cast<double>(f);
  if (back == value) return F32ToBF16(f);
  if (std::fabs(back) > std::fabs(value)) f = std::nextafter(f, 0.0f);  // truncate toward zero
  uint32_t bits = std::bit_cast<uint32_t>(f) | 1u;  // sticky bit: the value was inexact
  return F32ToBF16(std::bit_cast<float>(bits));
}

namespace {

template <typename S>
void AppendBytes(std::vector<uint8_t>& out, S value) {
  uint8_t raw[sizeof(S)];
  std::memcpy(raw, &value, sizeof(S));
  out.insert(out.end(), raw, raw + sizeof(S));
}

template <typename S>
S LoadAt(const std::vector<uint8_t>& data, int64_t i) {
  S value;
  std::memcpy(&value, data.data() + i * static_cast<int64_t>(sizeof(S)), sizeof(S));
  return value;
}

}  // namespace

int64_t ShapeNumel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t HostTensor::numel() const { return ShapeNumel(shape); }

std::string ShapeString(std::span<const int64_t> shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

absl::Status ValidateTensor(const HostTensor& tensor) {
  for (int64_t d : tensor.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape ", ShapeString(tensor.shape)));
    }
  }
  const int64_t expected = tensor.numel() * DTypeSize(tensor.dtype);
  if (static_cast<int64_t>(tensor.data.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor of dtype ", ToAbsl(DTypeName(tensor.dtype)), " and shape ", ShapeString(tensor.shape),
        " needs ", expected, " bytes but holds ", tensor.data.size()));
  }
  return absl::OkStatus();
}

template <typename T>
HostTensor HostTensor::From(std::span<const T> values, std::vector<int64_t> shape, DType dtype) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  ADJSH_CHECK(static_cast<int64_t>(values.size()) == t.numel(),
              "HostTensor::From: value count does not match the shape");
  t.data.reserve(values.size() * static_cast<size_t>(DTypeSize(dtype)));
  switch (dtype) {
    case DType::kF32:
      for (T v : values) AppendBytes(t.data, static_cast<float>(v));
      break;
    case DType::kF64:
      for (T v : values) AppendBytes(t.data, static_cast<double>(v));
      break;
    case DType::kBF16:
      for (T v : values) AppendBytes(t.data, F64ToBF16(static_cast<double>(v)));
      break;
    default:
      ADJSH_CHECK(false, "HostTensor::From supports F32, F64 and BF16 only");
  }
  return t;
}

template <typename T>
absl::StatusOr<std::vector<T>> HostTensor::To() const {
  if (absl::Status s = ValidateTensor(*this); !s.ok()) return s;
  const int64_t n = numel();
  std::vector<T> out(static_cast<size_t>(n));
  switch (dtype) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(LoadAt<float>(data, i));
      break;
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(LoadAt<double>(data, i));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(BF16ToF32(LoadAt<uint16_t>(data, i)));
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(F16ToF32(LoadAt<uint16_t>(data, i)));
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "expected a floating-point tensor (F32, F64, BF16, F16), got ", ToAbsl(DTypeName(dtype))));
  }
  return out;
}

template HostTensor HostTensor::From<float>(std::span<const float>, std::vector<int64_t>, DType);
template HostTensor HostTensor::From<double>(std::span<const double>, std::vector<int64_t>, DType);
template absl::StatusOr<std::vector<float>> HostTensor::To<float>() const;
template absl::StatusOr<std::vector<double>> HostTensor::To<double>() const;

}  // namespace adjsh
