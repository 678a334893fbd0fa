// `--device cpu|cuda:N` and `--storage f32|bf16`, shared by grad, train, coordinator and worker.
#ifndef ADJSH_CLI_DEVICE_FLAGS_H_
#define ADJSH_CLI_DEVICE_FLAGS_H_

#include "absl/status/statusor.h"
#include "cli/args.h"
#include "kernels/backend.h"

namespace adjsh::cli {

void AddDeviceFlags(ArgParser& a, const std::string& what);

// The parsed device: INVALID_ARGUMENT for a malformed value (bad usage, exit 2).
absl::StatusOr<Device> DeviceFromFlags(const ArgParser& a);

// Whether this process can compute on `device` (f32): UNIMPLEMENTED or FAILED_PRECONDITION
// naming what is missing (no CUDA in this build, no GPU, ordinal out of range; exit 1).
absl::Status CheckDeviceUsable(const Device& device);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_DEVICE_FLAGS_H_
