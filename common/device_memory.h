// The hook through which an accelerator backend reports its memory to the worker's metrics
// (adjsh_worker_gpu_memory_used_bytes, adjsh_worker_gpu_memory_peak_bytes, worker/metrics.h).
//
// Backend::MemoryProbe (kernels/backend.h) gives the probe of the device a worker computes on.
// CUDA: used = the bytes adjsh's allocations hold on the GPU now (weights, workspaces, cuBLAS's
// workspace; not the CUDA context itself), peak = the most they have held since the process
// started (kernels/cuda/device_block.h, DeviceMemoryProbeOf). `adjsh worker` passes it in
// WorkerMetricsOptions::device_memory (worker::MetricsOptionsFor), with the device's traffic
// (adjsh_worker_device_*_total). The CPU has no probe: the GPU series are then absent, never
// zero.
#ifndef ADJSH_COMMON_DEVICE_MEMORY_H_
#define ADJSH_COMMON_DEVICE_MEMORY_H_

#include <cstdint>
#include <functional>
#include <optional>

namespace adjsh {

// What crossed between the host and a device, and the device work the host waited on or
// allocated, as its backend counted it (kernels/cuda/context.h: every copy, sync and allocation
// of the CUDA backend goes through its device's Context, on a GPU and on the host-emulated one).
struct DeviceTraffic {
  uint64_t h2d_bytes = 0, d2h_bytes = 0;    // host to device, device to host
  uint64_t h2d_copies = 0, d2h_copies = 0;  // the copies that moved them
  uint64_t syncs = 0;                       // host waits on the device (stream syncs)
  uint64_t allocations = 0;                 // device allocations (weights, workspace growth)

  DeviceTraffic& operator+=(const DeviceTraffic& o) {
    h2d_bytes += o.h2d_bytes, d2h_bytes += o.d2h_bytes;
    h2d_copies += o.h2d_copies, d2h_copies += o.d2h_copies;
    syncs += o.syncs, allocations += o.allocations;
    return *this;
  }
  // What was counted between two readings (this one the later).
  DeviceTraffic operator-(const DeviceTraffic& earlier) const {
    DeviceTraffic d;
    d.h2d_bytes = h2d_bytes - earlier.h2d_bytes, d.d2h_bytes = d2h_bytes - earlier.d2h_bytes;
    d.h2d_copies = h2d_copies - earlier.h2d_copies;
    d.d2h_copies = d2h_copies - earlier.d2h_copies;
    d.syncs = syncs - earlier.syncs, d.allocations = allocations - earlier.allocations;
    return d;
  }
  bool empty() const {
    return h2d_bytes == 0 && d2h_bytes == 0 && h2d_copies == 0 && d2h_copies == 0 &&
           syncs == 0 && allocations == 0;
  }
};

struct DeviceMemoryUsage {
  uint64_t used_bytes = 0;
  uint64_t peak_bytes = 0;
  DeviceTraffic traffic;  // since the process started
};

// Called at every scrape, from the metrics server's thread: must be thread-safe and quick.
// nullopt: no reading right now (the gauges are left out of that scrape).
using DeviceMemoryProbe = std::function<std::optional<DeviceMemoryUsage>()>;

}  // namespace adjsh

#endif  // ADJSH_COMMON_DEVICE_MEMORY_H_
