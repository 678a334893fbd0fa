// The CUDA backend over the host-emulated device (tests/cuda/emulated_device.h), linked into the
// whole CLI as adjsh_emulated_gpu: `--device cuda:0` and `--worker-device cuda:0` then run the
// backend's host code, the same code a GPU runs above the device API, with the kernels emulated
// on the host; each process is a GPU of its own. tests/cuda/test_emulated_workers.py runs GPU
// workers with it where no GPU is.
#include <cuda_runtime.h>

#include "tests/cuda/emulated_device.h"
#include "kernels/cuda/mamba2_block.cu"
// The backend's class, with its device checks under another name: MakeCudaBackend below gives
// the emulated device, which has no CUDA device to count.
#define MakeCudaBackend MakeCudaBackendOnAGpu
#include "kernels/cuda/cuda_backend.cc"
#undef MakeCudaBackend

namespace adjsh::cuda {

absl::StatusOr<std::unique_ptr<Backend<float>>> MakeCudaBackend(const Device& device) {
  if (device.index != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(device.ToString(), " requested, but the emulated machine has 1 GPU"));
  }
  return std::unique_ptr<Backend<float>>(std::make_unique<CudaBackend>(device));
}

}  // namespace adjsh::cuda
