// The CUDA backend (kernels/backend.h) over DeviceBlock and DeviceHead: f32 compute, f32 or bf16
// storage, the wavefront schedule's ops (chunk forward from h0, exact chunk backward), the
// head, and the GPU's memory probe (DeviceMemoryProbeOf). The two-pass summaries and the
// truncated window are not implemented on CUDA and are refused by Require().
#ifndef ADJSH_KERNELS_CUDA_CUDA_BACKEND_H_
#define ADJSH_KERNELS_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace adjsh::cuda {

// FAILED_PRECONDITION when the machine has no CUDA device or fewer than device.index + 1.
absl::StatusOr<std::unique_ptr<Backend<float>>> MakeCudaBackend(const Device& device);

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_CUDA_BACKEND_H_
