#include "cli/device_flags.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu/kept_pool.h"

namespace adjsh::cli {

void AddDeviceFlags(ArgParser& a, const std::string& what) {
  a.Add("device", "cpu|cuda:N",
        what + " on the CPU or on CUDA GPU N (CUDA: f32, the exact gradient; no --window or "
        "--loss-mask)", "cpu");
}

namespace {
// --kept-mib in bytes: INVALID_ARGUMENT naming the flag.
absl::StatusOr<int64_t> KeptBudgetFromFlag(const ArgParser& a) {
  absl::StatusOr<int64_t> mib = a.GetInt("kept-mib", 0, int64_t{1} << 30);
  if (!mib.ok()) return mib.status();
  return *mib << 20;
}
}  // namespace

absl::StatusOr<Device> DeviceFromFlags(const ArgParser& a) {
  absl::StatusOr<Device> device = ParseDevice(a.Get("device"));
  if (!device.ok()) {
    return absl::InvalidArgumentError("--" + std::string(device.status().message()));
  }
  // The kept budget travels with the device into every backend made of it (kernels/backend.h
  // Device::kept_budget). Only a command with AddKeptFlag can be given the flag; without it,
  // or with the flag at its default, the budget is the default (AddKeptFlag's, in MiB).
  if (a.Given("kept-mib")) {
    absl::StatusOr<int64_t> budget = KeptBudgetFromFlag(a);
    if (!budget.ok()) return budget.status();
    device->kept_budget = *budget;
  }
  if (a.Given("device-mem-mib")) {
    absl::StatusOr<int64_t> mib = a.GetInt("device-mem-mib", 0, int64_t{1} << 30);
    if (!mib.ok()) return mib.status();
    device->row_budget = *mib << 20;
  }
  return device;
}

void AddWorkerDeviceFlag(ArgParser& a) {
  a.Add("worker-device", "DEV[,DEV...]",
        "with --workers: worker i computes on the i-th device of the list, cycling (cpu or "
        "cuda:N; e.g. cuda:0,cuda:1 for one worker per GPU) [default: every worker on the CPU]");
}

absl::StatusOr<std::vector<std::string>> WorkerDevicesFromFlags(const ArgParser& a) {
  if (!a.Has("worker-device")) return std::vector<std::string>{};
  std::vector<std::string> devices = absl::StrSplit(a.Get("worker-device"), ',');
  for (const std::string& d : devices) {
    absl::StatusOr<Device> device = ParseDevice(d);
    if (!device.ok()) {  // "device must be ...": named by this flag
      const absl::string_view why = device.status().message();
      return absl::InvalidArgumentError(absl::StrCat(
          "--worker-", absl::StartsWith(why, "device") ? "" : "device: ", why));
    }
  }
  return devices;
}

absl::StatusOr<Storage> StorageFromFlags(const ArgParser& a) {
  absl::StatusOr<Storage> storage = ParseStorage(a.Get("storage"));
  if (!storage.ok()) {
    return absl::InvalidArgumentError("--" + std::string(storage.status().message()));
  }
  return storage;
}

void AddKeptFlag(ArgParser& a) {
  a.Add("kept-mib", "MIB",
        "memory for the activations a span's summary (or a chunk's forward) keeps for the "
        "pass after it (or the chunk's backward), so that pass need not recompute them: the "
        "same results, fewer flops (0: recompute all)",
        std::to_string(cpu::kDefaultKeptBudget >> 20));
}

void AddDeviceMemFlag(ArgParser& a) {
  a.Add("device-mem-mib", "MIB",
        "CUDA: the GPU memory the span rows may take (layer inputs, states, adjoints), read "
        "when the first rows come; past it they live in pinned host memory and come back a "
        "chunk ahead over PCIe: the same results, slower [default: 80% of the free GPU memory]");
}

absl::Status CheckDeviceUsable(const Device& device) {
  if (device.is_cpu() && !device.bf16_storage) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(device);
  return backend.status();
}

void AddReduceFlag(ArgParser& a, const std::string& when) {
  a.Add("reduce", "tree|star",
        when + "where the parameter partials are summed: tree (among the workers, when every "
               "worker serves a peer endpoint; else through the coordinator) or star (always "
               "through the coordinator). The same bits either way",
        "tree");
}

absl::StatusOr<bool> ReduceFromFlags(const ArgParser& a) {
  const std::string reduce = a.Get("reduce");
  if (reduce == "tree" || reduce == "star") return reduce == "tree";
  return absl::InvalidArgumentError(
      absl::StrCat("--reduce must be tree or star, got '", reduce, "'"));
}

}  // namespace adjsh::cli
