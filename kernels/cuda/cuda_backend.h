// The CUDA backend (kernels/backend.h) over DeviceBlock and DeviceHead: f32 compute, f32 or bf16
// storage, the chunk forward from h0, the exact chunk backward, the head, and the GPU's memory
// probe (DeviceMemoryProbeOf). The summaries (so more than one span), the truncated window and
// the head's greedy count (--loss-mask) are not implemented on CUDA and are refused by
// Require().
#ifndef ADJSH_KERNELS_CUDA_CUDA_BACKEND_H_
#define ADJSH_KERNELS_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace adjsh::cuda {

// FAILED_PRECONDITION when the machine has no CUDA device or fewer than device.index + 1.
absl::StatusOr<std::unique_ptr<Backend<float>>> MakeCudaBackend(const Device& device);

// The ops the CUDA backend runs (its Supports), known without a device.
bool CudaSupports(Op op);

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_CUDA_BACKEND_H_
