// The CUDA backend over the host-emulated device (tests/cuda/emulated_device.h), linked into the
// whole CLI as adjsh_emulated_gpu: `--device cuda:0` and `--worker-device cuda:0` then run the
// backend's host code, the same code a GPU runs above the device API, with the kernels emulated
// on the host; each process is a GPU of its own (ADJSH_EMULATION_SKIP_KERNELS below: counting
// only). tests/cuda/test_emulated_workers.py runs GPU
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
namespace {
// ADJSH_EMULATION_SKIP_KERNELS=1: a counting run (host_emulation.h skip_kernels): the host code,
// its copies, syncs, allocations and device memory as a GPU's, no kernels; the results are
// zeros. For bench/worker_memory.py's per-worker device memory at long contexts.
[[maybe_unused]] const bool kSkipKernels = [] {
  const char* v = std::getenv("ADJSH_EMULATION_SKIP_KERNELS");
  emulation::skip_kernels = v != nullptr && v[0] != '\0' && v[0] != '0';
  // No kernel runs to guard against, and the copies' protection changes over a long context's
  // rows would cost more than the run (tests/cuda/emulated_memory.h).
  if (emulation::skip_kernels) emulation::guard_device_memory = false;
  return emulation::skip_kernels;
}();
}  // namespace

absl::StatusOr<std::unique_ptr<Backend<float>>> MakeCudaBackend(const Device& device) {
  if (device.index != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(device.ToString(), " requested, but the emulated machine has 1 GPU"));
  }
  return std::unique_ptr<Backend<float>>(std::make_unique<CudaBackend>(device));
}

}  // namespace adjsh::cuda
