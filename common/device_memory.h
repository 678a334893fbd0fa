// The hook through which an accelerator backend reports its memory to the worker's metrics
// (adjsh_worker_gpu_memory_used_bytes, adjsh_worker_gpu_memory_peak_bytes, worker/metrics.h).
//
// Backend::MemoryProbe (kernels/backend.h) gives the probe of the device a worker computes on.
// CUDA: used = the bytes adjsh's allocations hold on the GPU now (weights, workspaces, cuBLAS's
// workspace; not the CUDA context itself), peak = the most they have held since the process
// started (kernels/cuda/device_block.h, DeviceMemoryProbeOf). `adjsh worker` passes it in
// WorkerMetricsOptions::device_memory (worker::MetricsOptionsFor). The CPU has no probe: the GPU
// gauges are then absent, never zero.
#ifndef ADJSH_COMMON_DEVICE_MEMORY_H_
#define ADJSH_COMMON_DEVICE_MEMORY_H_

#include <cstdint>
#include <functional>
#include <optional>

namespace adjsh {

struct DeviceMemoryUsage {
  uint64_t used_bytes = 0;
  uint64_t peak_bytes = 0;
};

// Called at every scrape, from the metrics server's thread: must be thread-safe and quick.
// nullopt: no reading right now (the gauges are left out of that scrape).
using DeviceMemoryProbe = std::function<std::optional<DeviceMemoryUsage>()>;

}  // namespace adjsh

#endif  // ADJSH_COMMON_DEVICE_MEMORY_H_
