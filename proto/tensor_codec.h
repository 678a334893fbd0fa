// Tensors on the wire: a HostTensor is cut into TensorChunk pieces (proto/adjsh.proto) of at
// most max_piece_bytes data bytes each, and put back together by TensorAssembler, which checks
// everything a buggy or hostile peer can get wrong and never trusts a size it has not checked.
//
//   sender:   for (auto& c : SplitTensor("u", tensor)) writer->Write(c);        // or StreamTensor
//   receiver: TensorAssembler a(limits);
//             while (reader->Read(&c)) { auto done = a.Add(c); if (!done.ok()) ...; }
//             absl::Status s = a.Finish();                     // the stream ended cleanly?
//
// Errors: INVALID_ARGUMENT for a malformed stream (never retry), RESOURCE_EXHAUSTED when a
// tensor or the stream exceeds the configured limits.
#ifndef ADJSH_PROTO_TENSOR_CODEC_H_
#define ADJSH_PROTO_TENSOR_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "proto/adjsh.pb.h"

namespace adjsh {

// 1 MiB of data per piece: with the header, well below gRPC's default 4 MiB message limit.
inline constexpr size_t kDefaultPieceBytes = size_t{1} << 20;

// adjsh::DType <-> adjsh.v1.DType. FromProtoDType: INVALID_ARGUMENT for DTYPE_UNSPECIFIED and
// for values this build does not know (proto3 enums are open: any int32 can arrive).
v1::DType ToProtoDType(DType dtype);
absl::StatusOr<DType> FromProtoDType(v1::DType dtype);

// Cuts `tensor` into pieces of at most max_piece_bytes data bytes: the first carries the
// header, offsets are contiguous, the final one has last = true. A tensor with no bytes
// (a 0 dimension) is one chunk with header, empty data and last = true. Aborts (ADJSH_CHECK) on
// programming errors: max_piece_bytes == 0, or a tensor that fails ValidateTensor.
std::vector<v1::TensorChunk> SplitTensor(const std::string& name, const HostTensor& tensor,
                                         size_t max_piece_bytes = kDefaultPieceBytes);

// As SplitTensor, but hands each chunk to `sink` as soon as it is built, so that only one piece
// is held at a time (for large tensors written straight to a gRPC stream). Stops at, and
// returns, the first error of `sink`.
absl::Status StreamTensor(const std::string& name, const HostTensor& tensor,
                          size_t max_piece_bytes,
                          absl::FunctionRef<absl::Status(const v1::TensorChunk&)> sink);

inline constexpr size_t kMaxTensorNameBytes = 1024;

struct NamedTensor {
  std::string name;
  HostTensor tensor;
};

struct AssemblerLimits {
  uint64_t max_tensor_bytes = uint64_t{4} << 30;  // per tensor (its declared total_bytes)
  uint64_t max_total_bytes = uint64_t{16} << 30;  // all tensors of the stream together
  uint64_t max_tensors = 4096;                     // tensors in the stream (empty ones too)
};

// Rebuilds the tensors of one stream from its chunks, in order. Checks, per tensor: a header
// before any data, a name of 1..kMaxTensorNameBytes bytes not seen before in this stream, a
// known dtype, dims >= 0,
// numel * dtype size == total_bytes without overflow, offsets contiguous from 0, no byte past
// total_bytes, `last` exactly when all bytes arrived (INVALID_ARGUMENT otherwise); declared
// sizes and the count of tensors within the limits (RESOURCE_EXHAUSTED), checked at the
// header, before any allocation.
// Memory held: the tensor being assembled, its buffer reserved at the header (address space
// only until bytes arrive); completed tensors are handed to the caller.
// The first error is sticky: every later Add or Finish returns it again.
class TensorAssembler {
 public:
  explicit TensorAssembler(AssemblerLimits limits = {});

  // Feeds the next chunk. Returns the tensor this chunk completes (the chunk with last = true),
  // or nullopt while the current tensor still expects chunks.
  absl::StatusOr<std::optional<NamedTensor>> Add(const v1::TensorChunk& chunk);

  // Declares the end of the stream: INVALID_ARGUMENT when a tensor was left incomplete (its
  // last chunk never came). FAILED_PRECONDITION on Add after Finish.
  absl::Status Finish();

  bool in_tensor() const { return open_.has_value(); }  // a tensor is partly received
  int64_t tensors_completed() const { return completed_; }
  uint64_t total_bytes() const { return total_bytes_; }  // declared bytes of all headers so far

 private:
  absl::Status StartTensor(const v1::TensorHeader& header);
  absl::Status Fail(absl::Status status);

  AssemblerLimits limits_;
  std::optional<NamedTensor> open_;  // the tensor being received; its data grows to total
  uint64_t open_total_ = 0;          // its declared total_bytes
  std::set<std::string> names_;      // every name started in this stream
  uint64_t total_bytes_ = 0;
  int64_t completed_ = 0;
  bool finished_ = false;
  absl::Status error_;  // the first error, returned again by every later call
};

// Assembles a whole stream held in memory (Add for each chunk, then Finish) into a map by name.
absl::StatusOr<TensorMap> AssembleTensors(const std::vector<v1::TensorChunk>& chunks,
                                          AssemblerLimits limits = {});

// The rest of a client stream whose messages, after its header, each carry a `tensor` piece
// (PushResult's ResultChunk, PushSum's and PushReduced's SumChunk): every tensor by name, within
// `limits`; *total_bytes gets the declared bytes. INVALID_ARGUMENT for a message without a
// tensor ("a <what> carries tensors only after its header") or a malformed stream.
template <typename Reader, typename Message>
absl::StatusOr<TensorMap> ReadTensorStream(Reader& reader, const AssemblerLimits& limits,
                                           const char* what, uint64_t* total_bytes) {
  TensorAssembler assembler(limits);
  TensorMap tensors;
  Message msg;
  while (reader.Read(&msg)) {
    if (!msg.has_tensor()) {
      return absl::InvalidArgumentError(
          std::string("a ") + what + " carries tensors only after its header");
    }
    absl::StatusOr<std::optional<NamedTensor>> done = assembler.Add(msg.tensor());
    if (!done.ok()) return done.status();
    if (*done) tensors.emplace((*done)->name, std::move((*done)->tensor));
  }
  if (absl::Status s = assembler.Finish(); !s.ok()) return s;
  *total_bytes = assembler.total_bytes();
  return tensors;
}

}  // namespace adjsh

#endif  // ADJSH_PROTO_TENSOR_CODEC_H_
