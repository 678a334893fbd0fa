// Fuzz target: a job spec as `adjsh submit --spec FILE.json` and SubmitJob see it: JSON ->
// v1::JobSpec (protobuf's JSON mapping) -> ValidateJobSpec with small limits -> the trainer's
// options. Properties: only the documented status codes for a refused spec; an accepted spec
// is within the limits and gives options the trainer accepts (T >= 2, steps >= 1, C >= 1).
#include <cstddef>
#include <cstdint>
#include <string>

#include "coordinator/job_spec.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/util/json_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  adjsh::v1::JobSpec spec;
  if (!google::protobuf::util::JsonStringToMessage(json, &spec).ok()) return 0;
  const adjsh::coordinator::JobLimits limits{
      .max_context = 1 << 20, .max_layers = 64, .max_hidden = 4096,
      .max_tensor_bytes = uint64_t{64} << 20};
  const absl::Status s = adjsh::coordinator::ValidateJobSpec(spec, limits);
  if (!s.ok()) {
    const absl::StatusCode c = s.code();
    FUZZ_CHECK(c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kNotFound ||
               c == absl::StatusCode::kUnimplemented ||
               c == absl::StatusCode::kFailedPrecondition);
    FUZZ_CHECK(!s.message().empty());
    return 0;
  }
  FUZZ_CHECK(spec.context_length() >= 2 && spec.context_length() <= limits.max_context);
  if (spec.has_init()) {
    FUZZ_CHECK(spec.init().layers() >= 1 && spec.init().layers() <= limits.max_layers);
    FUZZ_CHECK(spec.init().hidden_size() >= 1 && spec.init().hidden_size() <= limits.max_hidden);
  }
  const adjsh::train::TrainOptions opt = adjsh::coordinator::JobTrainOptions(spec, 1, "");
  FUZZ_CHECK(opt.context == spec.context_length() && opt.steps >= 1 && opt.grad.chunk >= 1);
  return 0;
}
