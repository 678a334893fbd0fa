#include "worker/metrics.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/proc_stats.h"
#include "kernels/cpu/kept_pool.h"

namespace adjsh::worker {
namespace {

using metrics::Kind;
using metrics::MetricDef;

enum Index {
  kInfo, kDone, kFailed, kRejected, kTokens, kDuration, kReceived, kSent,
  kResident, kPeak, kLimit, kKept, kGpuUsed, kGpuPeak, kBuildInfo, kH2dBytes, kD2hBytes,
  kH2dCopies, kD2hCopies, kSyncs, kAllocations, kCount
};

const std::vector<MetricDef>& Table() {
  static const std::vector<MetricDef> table = {
      {"adjsh_worker_info", Kind::kGauge, "Always 1; labels name the worker and its device."},
      {"adjsh_worker_tasks_done_total", Kind::kCounter,
       "Tasks computed whose result was pushed."},
      {"adjsh_worker_tasks_failed_total", Kind::kCounter,
       "Tasks that ended without a result (lease lost, cancelled, invalid, stopping)."},
      {"adjsh_worker_results_rejected_total", Kind::kCounter,
       "Pushed results the coordinator did not accept (late or duplicate)."},
      {"adjsh_worker_tokens_processed_total", Kind::kCounter,
       "Tokens of the (layer, span) tasks computed (a span's rows, once per task)."},
      {"adjsh_worker_task_duration_seconds", Kind::kHistogram,
       "Time of a computed task from its pull to the coordinator's answer to its result."},
      {"adjsh_worker_received_bytes_total", Kind::kCounter,
       "Tensor bytes fetched from the coordinator (task inputs and parameters)."},
      {"adjsh_worker_sent_bytes_total", Kind::kCounter,
       "Tensor bytes pushed to the coordinator (task results)."},
      {"adjsh_worker_resident_memory_bytes", Kind::kGauge, "Resident set size (VmRSS)."},
      {"adjsh_worker_peak_resident_memory_bytes", Kind::kGauge,
       "Peak resident set size (VmHWM)."},
      {"adjsh_worker_memory_limit_bytes", Kind::kGauge,
       "Memory the process may use: its cgroup limit, or physical memory."},
      {"adjsh_worker_kept_activations_bytes", Kind::kGauge,
       "Activations the span summaries keep for the pass after them, with the recycled ones "
       "(at most --kept-mib)."},
      {"adjsh_worker_gpu_memory_used_bytes", Kind::kGauge,
       "Accelerator memory adjsh holds now: weights, workspaces (absent on the CPU)."},
      {"adjsh_worker_gpu_memory_peak_bytes", Kind::kGauge,
       "Most accelerator memory adjsh has held since the worker started (absent on the CPU)."},
      {"adjsh_build_info", Kind::kGauge,
       "Always 1; labels: the component, the version, the source revision, CUDA built."},
      {"adjsh_worker_device_h2d_bytes_total", Kind::kCounter,
       "Bytes copied from the host to the accelerator (absent on the CPU)."},
      {"adjsh_worker_device_d2h_bytes_total", Kind::kCounter,
       "Bytes copied from the accelerator to the host (absent on the CPU)."},
      {"adjsh_worker_device_h2d_copies_total", Kind::kCounter,
       "Host-to-accelerator copies (absent on the CPU)."},
      {"adjsh_worker_device_d2h_copies_total", Kind::kCounter,
       "Accelerator-to-host copies (absent on the CPU)."},
      {"adjsh_worker_device_syncs_total", Kind::kCounter,
       "Times the host waited for the accelerator's stream (absent on the CPU)."},
      {"adjsh_worker_device_allocations_total", Kind::kCounter,
       "Accelerator memory allocations (absent on the CPU)."},
  };
  return table;
}

// The name the worker registers with when it is given none (worker.cc does the same).
std::string NameOrHost(std::string name) {
  if (!name.empty()) return name;
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "worker";
  return buf;
}

double NonNegative(int64_t v) { return v > 0 ? static_cast<double>(v) : 0.0; }

}  // namespace

WorkerMetricsOptions MetricsOptionsFor(std::string name, const Backend<float>& backend) {
  const Device& device = backend.device();
  return {.device = device.is_cpu() ? "cpu" : absl::StrCat("cuda:", device.index),
          .name = std::move(name),
          .device_memory = backend.MemoryProbe()};
}

const std::vector<MetricDef>& WorkerMetrics::Definitions() { return Table(); }

WorkerMetrics::WorkerMetrics(WorkerMetricsOptions options)
    : opt_([&] {
        options.name = NameOrHost(std::move(options.name));
        return std::move(options);
      }()),
      // 1 ms .. ~131 s, doubling: a task is milliseconds on a small chunk, seconds on a big one.
      duration_(metrics::ExponentialBuckets(0.001, 2, 18)) {
  static_assert(kCount == 21, "one Index per table entry");
}

void WorkerMetrics::TaskDone(double seconds, int64_t tokens, uint64_t bytes_received,
                             uint64_t bytes_sent, bool accepted) {
  duration_.Observe(seconds);
  std::lock_guard<std::mutex> lock(mu_);
  ++done_;
  if (!accepted) ++rejected_;
  tokens_ += tokens;
  received_ += bytes_received;
  sent_ += bytes_sent;
}

void WorkerMetrics::TaskFailed(uint64_t bytes_received) {
  std::lock_guard<std::mutex> lock(mu_);
  ++failed_;
  received_ += bytes_received;
}

std::vector<prometheus::MetricFamily> WorkerMetrics::Collect() const {
  const metrics::Labels dev = {{"device", opt_.device}};
  std::vector<prometheus::MetricFamily> out;
  auto add = [&](Index i, double value) {
    out.push_back(metrics::Family(Table()[i]));
    metrics::AddSample(out.back(), value, dev);
  };
  out.push_back(metrics::Family(Table()[kInfo]));
  metrics::AddSample(out.back(), 1, {{"device", opt_.device}, {"worker", opt_.name}});
  out.push_back(metrics::Family(Table()[kBuildInfo]));
  metrics::AddSample(out.back(), 1, metrics::BuildInfoLabels("worker"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    add(kDone, static_cast<double>(done_));
    add(kFailed, static_cast<double>(failed_));
    add(kRejected, static_cast<double>(rejected_));
    add(kTokens, static_cast<double>(tokens_));
    add(kReceived, static_cast<double>(received_));
    add(kSent, static_cast<double>(sent_));
  }
  out.push_back(metrics::Family(Table()[kDuration]));
  metrics::AddHistogram(out.back(), duration_, dev);
  add(kResident, NonNegative(ResidentBytes()));
  add(kPeak, NonNegative(PeakResidentBytes()));
  add(kLimit, static_cast<double>(metrics::MemoryLimitBytes()));
  add(kKept, static_cast<double>(cpu::KeptBytes()));
  if (opt_.device_memory) {
    if (std::optional<DeviceMemoryUsage> gpu = opt_.device_memory()) {
      add(kGpuUsed, static_cast<double>(gpu->used_bytes));
      add(kGpuPeak, static_cast<double>(gpu->peak_bytes));
      const DeviceTraffic& t = gpu->traffic;
      add(kH2dBytes, static_cast<double>(t.h2d_bytes));
      add(kD2hBytes, static_cast<double>(t.d2h_bytes));
      add(kH2dCopies, static_cast<double>(t.h2d_copies));
      add(kD2hCopies, static_cast<double>(t.d2h_copies));
      add(kSyncs, static_cast<double>(t.syncs));
      add(kAllocations, static_cast<double>(t.allocations));
    }
  }
  return out;
}

}  // namespace adjsh::worker
