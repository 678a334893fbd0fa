// ADJSH_LAUNCH(kernel, grid, block, stream, args...): a kernel launch followed by its check, the
// one way adjsh launches a kernel. The check (CheckLaunch, launch_check.cc) aborts naming the
// kernel and its launch site when the launch fails. A launch is asynchronous, so a kernel that
// faults (an illegal address, a trap) would surface as a sticky error at some later copy or sync
// that names nothing: with ADJSH_CUDA_SYNC=1 in the environment, the check also synchronises the
// device after every launch, so that fault is named too (a debugging mode: slower).
// tests/cuda/host_emulation.h defines ADJSH_LAUNCH first to run the kernels' code on the host
// (block_emulation_test.cc includes the .cu files), where every launch is synchronous already,
// hence the guard.
#ifndef ADJSH_KERNELS_CUDA_LAUNCH_CUH_
#define ADJSH_KERNELS_CUDA_LAUNCH_CUH_

#include "kernels/cuda/context.h"

namespace adjsh::cuda {

// After a launch of `kernel` (its name as written at the launch) at file:line: the launch error
// (cudaGetLastError) and, when SyncEveryLaunch(), the device's (cudaDeviceSynchronize); on an
// error, prints the kernel, the site and the error, and aborts.
void CheckLaunch(const char* kernel, const char* file, int line);

// Whether ADJSH_CUDA_SYNC is set to anything but "" or "0". Read once per process (the first
// launch reads it), and said once on stderr when set, so a log shows the mode it ran in.
bool SyncEveryLaunch();

}  // namespace adjsh::cuda

#ifndef ADJSH_LAUNCH
#define ADJSH_LAUNCH(kernel, grid, block, stream, ...)       \
  do {                                                       \
    kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__);   \
    ::adjsh::cuda::CheckLaunch(#kernel, __FILE__, __LINE__); \
  } while (0)
#endif

#endif  // ADJSH_KERNELS_CUDA_LAUNCH_CUH_
