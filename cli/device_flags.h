// `--device cpu|cuda:N`, shared by grad, train, coordinator and worker, the parsing of
// `--storage full|bf16` (grad, train and worker add that flag with their own meaning), and
// where the workers' partials are summed (`--reduce tree|star`: coordinator, train, grad).
#ifndef ADJSH_CLI_DEVICE_FLAGS_H_
#define ADJSH_CLI_DEVICE_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/args.h"
#include "engine/grad_options.h"
#include "kernels/backend.h"

namespace adjsh::cli {

void AddDeviceFlags(ArgParser& a, const std::string& what);

// The parsed device: INVALID_ARGUMENT for a malformed value (bad usage, exit 2).
absl::StatusOr<Device> DeviceFromFlags(const ArgParser& a);
// `--worker-device DEV[,DEV...]` of the local clusters of grad and train (--workers N).
void AddWorkerDeviceFlag(ArgParser& a);
// Its devices, each checked to parse (INVALID_ARGUMENT naming the flag: bad usage, exit 2);
// empty when the flag is not given. Whether a device is usable is each worker's to say.
absl::StatusOr<std::vector<std::string>> WorkerDevicesFromFlags(const ArgParser& a);
// The parsed --storage: INVALID_ARGUMENT naming the flag (bad usage, exit 2).
absl::StatusOr<Storage> StorageFromFlags(const ArgParser& a);

// `--kept-mib MIB` of the processes that run span tasks (grad, train, worker): the budget of
// their CPU backends' kept store for the activations a chunk's summary keeps for the pass after
// it (kernels/cpu/kept_pool.h; the same results, only faster), carried by Device::kept_budget
// (DeviceFromFlags, which refuses a bad value naming the flag: bad usage, exit 2).
void AddKeptFlag(ArgParser& a);
// `--device-mem-mib MIB` of the same processes: the GPU memory a resident model's span rows may
// take, past which they live in mapped pinned host memory, copied back a chunk ahead of their
// reader (Device::row_budget; CUDA only, the CPU has no use for it). Refused like --kept-mib.
void AddDeviceMemFlag(ArgParser& a);

// `--reduce tree|star` (default tree); `when` prefixes its help ("with --workers: ").
void AddReduceFlag(ArgParser& a, const std::string& when);
// --reduce: true for tree (the worker tree), false for star; INVALID_ARGUMENT naming the flag
// (bad usage, exit 2) for anything else.
absl::StatusOr<bool> ReduceFromFlags(const ArgParser& a);

// Whether this process can compute on `device` (f32): UNIMPLEMENTED or FAILED_PRECONDITION
// naming what is missing (no CUDA in this build, no GPU, ordinal out of range; exit 1).
absl::Status CheckDeviceUsable(const Device& device);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_DEVICE_FLAGS_H_
