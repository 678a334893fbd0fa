// Tensor streaming: HostTensor -> TensorChunk pieces and back, with every size checked before
// it is trusted (a header's total_bytes decides an allocation, so it is checked against the
// shape and the limits first; dims are multiplied with overflow checks).
#include "proto/tensor_codec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/strings.h"

namespace adjsh {
namespace {

// A peer-chosen name quoted in an error message, cut short so that a hostile one cannot bloat it.
std::string Quoted(const std::string& name) {
  constexpr size_t kShown = 120;
  if (name.size() <= kShown) return absl::StrCat("\"", name, "\"");
  return absl::StrCat("\"", absl::string_view(name.data(), kShown), "...\" (", name.size(),
                      " bytes)");
}

std::string ShapeOf(const v1::TensorHeader& header) {
  return ShapeString(std::span<const int64_t>(header.shape().data(),
                                              static_cast<size_t>(header.shape_size())));
}

}  // namespace

v1::DType ToProtoDType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::F32;
    case DType::kF64: return v1::F64;
    case DType::kBF16: return v1::BF16;
    case DType::kF16: return v1::F16;
    case DType::kI32: return v1::I32;
    case DType::kI64: return v1::I64;
    case DType::kU8: return v1::U8;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> FromProtoDType(v1::DType dtype) {
  switch (dtype) {
    case v1::F32: return DType::kF32;
    case v1::F64: return DType::kF64;
    case v1::BF16: return DType::kBF16;
    case v1::F16: return DType::kF16;
    case v1::I32: return DType::kI32;
    case v1::I64: return DType::kI64;
    case v1::U8: return DType::kU8;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError("dtype is DTYPE_UNSPECIFIED");
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype value ", static_cast<int>(dtype),
                   " (known: F32, F64, BF16, F16, I32, I64, U8)"));
}

absl::Status StreamTensor(const std::string& name, const HostTensor& tensor,
                          size_t max_piece_bytes,
                          absl::FunctionRef<absl::Status(const v1::TensorChunk&)> sink) {
  ADJSH_CHECK(max_piece_bytes > 0, "StreamTensor: max_piece_bytes must be positive");
  ADJSH_CHECK(ValidateTensor(tensor).ok(),
              "StreamTensor: the tensor's bytes do not match its dtype and shape");
  const size_t size = tensor.data.size();
  size_t offset = 0;
  do {  // at least once: an empty tensor is one chunk
    const size_t n = std::min(max_piece_bytes, size - offset);
    v1::TensorChunk chunk;
    if (offset == 0) {
      v1::TensorHeader* header = chunk.mutable_header();
      header->set_name(name);
      header->set_dtype(ToProtoDType(tensor.dtype));
      header->mutable_shape()->Add(tensor.shape.begin(), tensor.shape.end());
      header->set_total_bytes(size);
    }
    chunk.set_offset(offset);
    chunk.set_data(reinterpret_cast<const char*>(tensor.data.data()) + offset, n);
    chunk.set_last(offset + n == size);
    if (absl::Status s = sink(chunk); !s.ok()) return s;
    offset += n;
  } while (offset < size);
  return absl::OkStatus();
}

std::vector<v1::TensorChunk> SplitTensor(const std::string& name, const HostTensor& tensor,
                                         size_t max_piece_bytes) {
  std::vector<v1::TensorChunk> chunks;
  absl::Status s = StreamTensor(name, tensor, max_piece_bytes,
                                [&](const v1::TensorChunk& chunk) {
                                  chunks.push_back(chunk);
                                  return absl::OkStatus();
                                });
  ADJSH_CHECK(s.ok(), "SplitTensor: the sink cannot fail");
  return chunks;
}

TensorAssembler::TensorAssembler(AssemblerLimits limits) : limits_(limits) {}

absl::Status TensorAssembler::Fail(absl::Status status) {
  error_ = status;
  open_.reset();
  return status;
}

absl::Status TensorAssembler::StartTensor(const v1::TensorHeader& header) {
  const std::string& name = header.name();
  if (name.empty()) return Fail(absl::InvalidArgumentError("tensor header with an empty name"));
  if (name.size() > kMaxTensorNameBytes) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "tensor name ", Quoted(name), " is longer than ", kMaxTensorNameBytes, " bytes")));
  }
  if (names_.contains(name)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quoted(name), " appears twice in the stream")));
  }
  if (names_.size() >= limits_.max_tensors) {
    return Fail(absl::ResourceExhaustedError(absl::StrCat(
        "tensor ", Quoted(name), " would be tensor ", names_.size() + 1,
        " of the stream, over the limit of ", limits_.max_tensors)));
  }
  absl::StatusOr<DType> dtype = FromProtoDType(header.dtype());
  if (!dtype.ok()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quoted(name), ": ", dtype.status().message())));
  }
  // numel * dtype size, left to right as ShapeNumel does, so that no later product overflows.
  int64_t bytes = DTypeSize(*dtype);
  int64_t numel = 1;
  for (int64_t d : header.shape()) {
    if (d < 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "tensor ", Quoted(name), ": negative dimension in shape ", ShapeOf(header))));
    }
    if (__builtin_mul_overflow(numel, d, &numel)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "tensor ", Quoted(name), ": shape ", ShapeOf(header), " overflows 64 bits")));
    }
  }
  if (__builtin_mul_overflow(numel, bytes, &bytes)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quoted(name), ": byte size of shape ", ShapeOf(header),
                     " overflows 64 bits")));
  }
  const uint64_t total = header.total_bytes();
  if (total != static_cast<uint64_t>(bytes)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "tensor ", Quoted(name), ": total_bytes ", total, " does not match dtype ",
        ToAbsl(DTypeName(*dtype)), " and shape ", ShapeOf(header), " (", bytes, " bytes)")));
  }
  if (total > limits_.max_tensor_bytes) {
    return Fail(absl::ResourceExhaustedError(
        absl::StrCat("tensor ", Quoted(name), " has ", total, " bytes, over the limit of ",
                     limits_.max_tensor_bytes, " bytes per tensor")));
  }
  // total_bytes_ <= max_total_bytes always holds, so the subtraction cannot wrap.
  if (total_bytes_ > limits_.max_total_bytes || total > limits_.max_total_bytes - total_bytes_) {
    return Fail(absl::ResourceExhaustedError(absl::StrCat(
        "tensor ", Quoted(name), " (", total, " bytes) brings the stream to ",
        total_bytes_ + total, " bytes, over the limit of ", limits_.max_total_bytes, " bytes")));
  }
  names_.insert(name);
  total_bytes_ += total;
  open_total_ = total;
  open_.emplace();
  open_->name = name;
  open_->tensor.dtype = *dtype;
  open_->tensor.shape.assign(header.shape().begin(), header.shape().end());
  open_->tensor.data.reserve(static_cast<size_t>(total));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<NamedTensor>> TensorAssembler::Add(const v1::TensorChunk& chunk) {
  if (!error_.ok()) return error_;
  if (finished_) return absl::FailedPreconditionError("TensorAssembler: Add after Finish");
  if (chunk.has_header()) {
    if (open_) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "header of tensor ", Quoted(chunk.header().name()), " arrived while tensor ",
          Quoted(open_->name), " is incomplete (", open_->tensor.data.size(), " of ",
          open_total_, " bytes, no last chunk)")));
    }
    if (absl::Status s = StartTensor(chunk.header()); !s.ok()) return s;
  } else if (!open_) {
    return Fail(absl::InvalidArgumentError(
        completed_ == 0 ? "the stream's first chunk has no tensor header"
                        : "a chunk without a header follows a completed tensor (the first "
                          "chunk of each tensor must carry its header)"));
  }
  std::vector<uint8_t>& data = open_->tensor.data;
  const uint64_t received = data.size();
  if (chunk.offset() != received) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quoted(open_->name), ": chunk at offset ", chunk.offset(),
                     ", expected ", received, " (chunks must be contiguous and in order)")));
  }
  const uint64_t n = chunk.data().size();
  if (n > open_total_ - received) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quoted(open_->name), ": chunk bytes [", received, ", ",
                     received + n, ") run past total_bytes ", open_total_)));
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(chunk.data().data());
  data.insert(data.end(), bytes, bytes + n);
  if (!chunk.last()) return std::optional<NamedTensor>();
  if (data.size() != open_total_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quoted(open_->name), ": last chunk ends at byte ", data.size(),
                     " of ", open_total_)));
  }
  std::optional<NamedTensor> done = std::move(open_);
  open_.reset();
  ++completed_;
  return done;
}

absl::Status TensorAssembler::Finish() {
  if (!error_.ok()) return error_;
  if (open_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "the stream ended inside tensor ", Quoted(open_->name), ": ", open_->tensor.data.size(),
        " of ", open_total_, " bytes received, no last chunk")));
  }
  finished_ = true;
  return absl::OkStatus();
}

absl::StatusOr<TensorMap> AssembleTensors(const std::vector<v1::TensorChunk>& chunks,
                                          AssemblerLimits limits) {
  TensorAssembler assembler(limits);
  TensorMap tensors;
  for (const v1::TensorChunk& chunk : chunks) {
    absl::StatusOr<std::optional<NamedTensor>> done = assembler.Add(chunk);
    if (!done.ok()) return done.status();
    if (done->has_value()) {
      NamedTensor& t = **done;
      tensors.emplace(std::move(t.name), std::move(t.tensor));
    }
  }
  if (absl::Status s = assembler.Finish(); !s.ok()) return s;
  return tensors;
}

}  // namespace adjsh
