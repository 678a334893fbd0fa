// ADJSH_LAUNCH(kernel, grid, block, stream, args...): a kernel launch followed by the launch
// error check. tests/cuda/host_emulation.h defines it first to run the kernels' code on the host
// (block_emulation_test.cc includes the .cu files), hence the guard.
#ifndef ADJSH_KERNELS_CUDA_LAUNCH_CUH_
#define ADJSH_KERNELS_CUDA_LAUNCH_CUH_

#include "kernels/cuda/context.h"

#ifndef ADJSH_LAUNCH
#define ADJSH_LAUNCH(kernel, grid, block, stream, ...)     \
  do {                                                     \
    kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__); \
    ADJSH_CUDA_CHECK(cudaGetLastError());                  \
  } while (0)
#endif

#endif  // ADJSH_KERNELS_CUDA_LAUNCH_CUH_
