#include "engine/grad_options.h"

#include <string>

#include "absl/strings/str_format.h"

namespace adjsh {

absl::StatusOr<Storage> ParseStorage(std::string_view name) {
  if (name == "full") return Storage::kCompute;
  if (name == "bf16") return Storage::kBF16;
  return absl::InvalidArgumentError(
      absl::StrFormat("storage must be full or bf16, got '%s'", std::string(name)));
}

std::string_view StorageName(Storage storage) {
  return storage == Storage::kBF16 ? "bf16" : "full";
}

absl::StatusOr<Cotangent> CotangentFromName(std::string_view name) {
  if (name == "exact") return Cotangent::kExact;
  if (name == "top-of-stack") return Cotangent::kTopOfStack;
  return absl::InvalidArgumentError(
      absl::StrFormat("--cotangent must be exact or top-of-stack, got '%s'", name));
}

absl::StatusOr<Schedule> ScheduleFromName(std::string_view name) {
  if (name == "spans") return Schedule::kSpans;
  if (name == "wavefront") return Schedule::kWavefront;
  if (name == "two-pass") return Schedule::kTwoPass;
  return absl::InvalidArgumentError(absl::StrFormat(
      "--schedule must be spans, wavefront or two-pass, got '%s'", name));
}

}  // namespace adjsh
