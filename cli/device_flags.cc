#include "cli/device_flags.h"

namespace adjsh::cli {

void AddDeviceFlags(ArgParser& a, const std::string& what) {
  a.Add("device", "cpu|cuda:N",
        what + " on the CPU or on CUDA GPU N (f32, exact wavefront gradient only)", "cpu");
  a.Add("storage", "f32|bf16",
        "with --device cuda:N, activations and weights stored in bf16 (sums in f32)", "f32");
}

absl::StatusOr<Device> DeviceFromFlags(const ArgParser& a) {
  absl::StatusOr<Device> device = ParseDevice(a.Get("device"));
  if (!device.ok()) {
    return absl::InvalidArgumentError("--" + std::string(device.status().message()));
  }
  if (absl::Status s = ParseStorage(a.Get("storage"), *device); !s.ok()) {
    return absl::InvalidArgumentError("--" + std::string(s.message()));
  }
  return device;
}

absl::Status CheckDeviceUsable(const Device& device) {
  if (device.is_cpu() && !device.bf16_storage) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(device);
  return backend.status();
}

}  // namespace adjsh::cli
