// The check after every kernel launch (launch.cuh ADJSH_LAUNCH): host code only, so that the
// environment is read in one place for the whole process.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/launch.cuh"

namespace adjsh::cuda {

bool SyncEveryLaunch() {
  static const bool sync = [] {
    const char* v = std::getenv("ADJSH_CUDA_SYNC");
    const bool on = v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
    if (on) {
      std::fprintf(stderr, "adjsh: ADJSH_CUDA_SYNC=%s: the device is synchronised after every "
                   "kernel launch, and a kernel that faults is named\n", v);
    }
    return on;
  }();
  return sync;
}

void CheckLaunch(const char* kernel, const char* file, int line) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s:%d: CUDA error launching kernel %s: %s (%s)\n", file, line, kernel,
                 cudaGetErrorString(err), cudaGetErrorName(err));
    std::abort();
  }
  if (!SyncEveryLaunch()) return;
  err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    // The device's error is sticky: it can also come from unchecked work queued before this
    // launch (a cuBLAS call, a copy) or from another thread's kernels on the same device; with
    // one thread, the kernels before this one all synchronised cleanly.
    std::fprintf(stderr,
                 "%s:%d: CUDA error in kernel %s (ADJSH_CUDA_SYNC: the device synchronised after "
                 "its launch): %s (%s)\n",
                 file, line, kernel, cudaGetErrorString(err), cudaGetErrorName(err));
    std::abort();
  }
}

}  // namespace adjsh::cuda
