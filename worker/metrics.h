// The worker's Prometheus metrics (served by `adjsh worker --metrics-listen HOST:PORT`).
// Every series carries the label device="cpu" (or the accelerator, e.g. "cuda:0").
//
//   adjsh_worker_info{worker}                     1; the worker's name
//   adjsh_worker_tasks_done_total                 tasks computed and their result pushed
//   adjsh_worker_tasks_failed_total               tasks that ended without a result (lease lost,
//                                                 cancelled, invalid, unsupported, stopping)
//   adjsh_worker_results_rejected_total           pushed results the coordinator refused (late)
//   adjsh_worker_tokens_processed_total           tokens of the spans of the done tasks
//   adjsh_worker_task_duration_seconds            histogram: a done task, from pull to answer
//   adjsh_worker_received_bytes_total             tensor bytes fetched (inputs, parameters)
//   adjsh_worker_sent_bytes_total                 tensor bytes pushed (results)
//   adjsh_worker_resident_memory_bytes            VmRSS now (read at each scrape)
//   adjsh_worker_peak_resident_memory_bytes       VmHWM
//   adjsh_worker_memory_limit_bytes               cgroup limit or physical memory
//   adjsh_worker_gpu_memory_used_bytes            from the DeviceMemoryProbe (absent on the CPU):
//                                                 on CUDA, the bytes adjsh holds on the GPU now
//   adjsh_worker_gpu_memory_peak_bytes            likewise: the most held since the start
//   adjsh_worker_device_{h2d,d2h}_bytes_total     the probe's traffic (absent on the CPU):
//   adjsh_worker_device_{h2d,d2h}_copies_total    bytes and copies each way, stream syncs and
//   adjsh_worker_device_{syncs,allocations}_total allocations (kernels/cuda/context.h counts)
// Thread-safe: the task loop records, the metrics server's thread collects.
#ifndef ADJSH_WORKER_METRICS_H_
#define ADJSH_WORKER_METRICS_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/device_memory.h"
#include "common/metrics_server.h"
#include "kernels/backend.h"
#include "prometheus/collectable.h"
#include "prometheus/histogram.h"

namespace adjsh::worker {

struct WorkerMetricsOptions {
  std::string device = "cpu";      // the `device` label
  std::string name;                // the `worker` label of adjsh_worker_info
  DeviceMemoryProbe device_memory;  // empty on the CPU: no GPU gauges
};

// The options of worker `name` computing with `backend`: the label of its device ("cpu",
// "cuda:N") and the backend's memory probe (Backend::MemoryProbe: empty on the CPU). The options
// may outlive `backend`.
WorkerMetricsOptions MetricsOptionsFor(std::string name, const Backend<float>& backend);

class WorkerMetrics final : public prometheus::Collectable {
 public:
  explicit WorkerMetrics(WorkerMetricsOptions options);

  // A task whose result was pushed after `seconds`: `tokens` rows of its chunk, and the tensor
  // bytes it fetched and pushed; `accepted` as the coordinator answered.
  void TaskDone(double seconds, int64_t tokens, uint64_t bytes_received, uint64_t bytes_sent,
                bool accepted);
  // A task that ended without a result, after fetching `bytes_received`.
  void TaskFailed(uint64_t bytes_received);

  std::vector<prometheus::MetricFamily> Collect() const override;

  // Every metric this class can export (the GPU gauges only with a probe).
  static const std::vector<metrics::MetricDef>& Definitions();

 private:
  const WorkerMetricsOptions opt_;
  mutable std::mutex mu_;
  int64_t done_ = 0, failed_ = 0, rejected_ = 0, tokens_ = 0;  // guarded by mu_
  uint64_t received_ = 0, sent_ = 0;                            // guarded by mu_
  prometheus::Histogram duration_;                              // thread-safe itself
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_METRICS_H_
