// Runs CUDA kernels on the host for tests: each block's threads are host threads, launched
// block after block; __syncthreads is a barrier of the block, __shfl_xor_sync an exchange
// through a per-block array between two barriers (every thread of a block must reach each
// shuffle, as the scan kernels guarantee: their control flow is uniform per block), and
// __shared__ arrays are function statics (blocks never run at once). Include before the kernel
// source, after the CUDA headers.
#ifndef ADJSH_TESTS_CUDA_HOST_EMULATION_H_
#define ADJSH_TESTS_CUDA_HOST_EMULATION_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "tests/cuda/emulated_memory.h"

namespace adjsh::emulation {

inline thread_local uint3 thread_idx, block_idx;
inline thread_local dim3 block_dim, grid_dim;
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<float> exchange;

// A counting run (bench/device_traffic.cc): launches (and the emulated GEMMs) do nothing, so the
// host code above the device API runs with its copies, syncs and allocations at the cost of the
// copies alone; what the device would compute is not.
inline bool skip_kernels = false;

inline void SyncThreads() { block_barrier->arrive_and_wait(); }

inline float ShflXor(unsigned, float v, int lane_mask, int) {
  exchange[thread_idx.x] = v;
  block_barrier->arrive_and_wait();
  const float got = exchange[thread_idx.x ^ static_cast<unsigned>(lane_mask)];
  block_barrier->arrive_and_wait();
  return got;
}

// A launch a GPU would refuse (cudaErrorInvalidConfiguration) fails here too, loudly: the
// ADJSH_CUDA_CHECK after a real launch would abort the same way.
inline void RefuseLaunch(const char* kernel, dim3 grid, dim3 block, const char* why) {
  std::fprintf(stderr,
               "emulated launch of %s refused (grid %u x %u x %u, block %u x %u x %u): %s\n",
               kernel, grid.x, grid.y, grid.z, block.x, block.y, block.z, why);
  std::abort();
}
inline void CheckLaunch(const char* kernel, dim3 grid, dim3 block) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0)
    RefuseLaunch(kernel, grid, block, "a zero grid or block dimension");
  if (static_cast<uint64_t>(block.x) * block.y * block.z > 1024)
    RefuseLaunch(kernel, grid, block, "more than 1024 threads per block");
  if (grid.y > 65535 || grid.z > 65535)
    RefuseLaunch(kernel, grid, block, "grid y or z above 65535");
  if (block.y != 1 || block.z != 1)  // a GPU takes them; this emulation runs block.x threads
    RefuseLaunch(kernel, grid, block, "the emulation runs one-dimensional blocks only");
}

// One host thread per thread of a block, created once per launch; they run the grid's blocks
// one after another, with a barrier between blocks (so the __shared__ statics are one block's),
// the device's memory open to them (emulated_memory.h) while they run.
template <typename Fn>
void Launch(const char* kernel, dim3 grid, dim3 block, Fn fn) {
  CheckLaunch(kernel, grid, block);
  if (skip_kernels) return;
  DeviceAccess access;
  std::barrier<> barrier(block.x);
  block_barrier = &barrier;
  exchange.assign(block.x, 0.0f);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < block.x; ++t) {
    threads.emplace_back([&, t] {
      thread_idx = {t, 0, 0};
      block_dim = block;
      grid_dim = grid;
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          block_idx = {bx, by, 0};
          fn();
          barrier.arrive_and_wait();
        }
    });
  }
  for (std::thread& th : threads) th.join();
}

}  // namespace adjsh::emulation

#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)
#define threadIdx ::adjsh::emulation::thread_idx
#define blockIdx ::adjsh::emulation::block_idx
#define blockDim ::adjsh::emulation::block_dim
#define gridDim ::adjsh::emulation::grid_dim
#define __syncthreads ::adjsh::emulation::SyncThreads
#define __shfl_xor_sync ::adjsh::emulation::ShflXor
#define ADJSH_LAUNCH(kernel, grid, block, stream, ...) \
  ::adjsh::emulation::Launch(#kernel, dim3(grid), dim3(block), [&] { kernel(__VA_ARGS__); })

#endif  // ADJSH_TESTS_CUDA_HOST_EMULATION_H_
