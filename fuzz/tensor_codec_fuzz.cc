// Fuzz target: the tensor-message decoder (proto/tensor_codec.h). The input is a stream of
// length-delimited TensorChunk messages (varint length, then the serialized message: what
// protobuf's delimited_message_util writes), fed to one TensorAssembler with small limits.
// Properties: errors are INVALID_ARGUMENT or RESOURCE_EXHAUSTED and sticky; completed tensors
// are valid, within the limits, and survive SplitTensor -> AssembleTensors unchanged.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_check.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/util/delimited_message_util.h"
#include "proto/tensor_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const adjsh::AssemblerLimits limits{.max_tensor_bytes = 1 << 16, .max_total_bytes = 1 << 18};
  adjsh::TensorAssembler assembler(limits);
  google::protobuf::io::CodedInputStream in(data, static_cast<int>(size));
  absl::Status error;
  for (;;) {
    adjsh::v1::TensorChunk chunk;
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromCodedStream(&chunk, &in, &clean_eof)) break;
    absl::StatusOr<std::optional<adjsh::NamedTensor>> got = assembler.Add(chunk);
    if (!got.ok()) {
      const absl::StatusCode c = got.status().code();
      FUZZ_CHECK(c == absl::StatusCode::kInvalidArgument ||
                 c == absl::StatusCode::kResourceExhausted);
      if (error.ok()) error = got.status();
      FUZZ_CHECK(got.status() == error);  // the first error is sticky
      continue;
    }
    FUZZ_CHECK(error.ok());
    if (!got->has_value()) continue;
    const adjsh::NamedTensor& t = **got;
    FUZZ_CHECK(adjsh::ValidateTensor(t.tensor).ok());
    FUZZ_CHECK(t.tensor.data.size() <= limits.max_tensor_bytes);
    FUZZ_CHECK(!t.name.empty() && t.name.size() <= adjsh::kMaxTensorNameBytes);
    absl::StatusOr<adjsh::TensorMap> back =
        adjsh::AssembleTensors(adjsh::SplitTensor(t.name, t.tensor, 7), limits);
    FUZZ_CHECK(back.ok() && back->size() == 1);
    const adjsh::HostTensor& b = back->begin()->second;
    FUZZ_CHECK(b.dtype == t.tensor.dtype && b.shape == t.tensor.shape && b.data == t.tensor.data);
  }
  const absl::Status finished = assembler.Finish();
  if (!error.ok()) FUZZ_CHECK(finished == error);
  FUZZ_CHECK(assembler.total_bytes() <= limits.max_total_bytes || !finished.ok());
  return 0;
}
