#include "cli/device_flags.h"

namespace adjsh::cli {

void AddDeviceFlags(ArgParser& a, const std::string& what) {
  a.Add("device", "cpu|cuda:N",
        what + " on the CPU or on CUDA GPU N (f32, exact wavefront gradient only)", "cpu");
}

absl::StatusOr<Device> DeviceFromFlags(const ArgParser& a) {
  absl::StatusOr<Device> device = ParseDevice(a.Get("device"));
  if (!device.ok()) {
    return absl::InvalidArgumentError("--" + std::string(device.status().message()));
  }
  return device;
}

absl::StatusOr<Storage> StorageFromFlags(const ArgParser& a) {
  absl::StatusOr<Storage> storage = ParseStorage(a.Get("storage"));
  if (!storage.ok()) {
    return absl::InvalidArgumentError("--" + std::string(storage.status().message()));
  }
  return storage;
}

absl::Status CheckDeviceUsable(const Device& device) {
  if (device.is_cpu() && !device.bf16_storage) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(device);
  return backend.status();
}

}  // namespace adjsh::cli
