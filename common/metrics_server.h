// Prometheus metrics over HTTP and the helpers the coordinator's and the worker's metrics share. Names follow Prometheus conventions: an `adjsh_` prefix, base
// units (`_seconds`, `_bytes`), counters end in `_total`.
//
//   auto server = metrics::MetricsServer::Start("127.0.0.1:0");   // port 0: a free port
//   (*server)->Add(std::make_shared<WorkerMetrics>(...));          // any prometheus::Collectable
//   // GET http://(*server)->address()/metrics
//
// Every metric a component exports is listed in its table of MetricDef (worker/metrics.h,
// coordinator/metrics.h); families are built from those entries at scrape time, so the table is
// the one place that names them (tests/metrics checks the dashboards and alert rules against it).
//
// The values, histograms and the text format are prometheus-cpp's (core); the HTTP endpoint is
// this file's own small server rather than prometheus-cpp's civetweb Exposer: civetweb's
// threads get a fixed 100 KiB stack, of which the static thread-local storage of adjsh's
// libraries (OpenBLAS's above all: docs/BENCHMARKS.md) leaves too little, and a scrape
// overflowed it.
#ifndef ADJSH_COMMON_METRICS_SERVER_H_
#define ADJSH_COMMON_METRICS_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"

namespace adjsh::metrics {

enum class Kind { kCounter, kGauge, kHistogram };

// One exported metric family. For a histogram, `name` is the family name; its series are
// name_bucket, name_sum and name_count.
struct MetricDef {
  std::string_view name;
  Kind kind;
  std::string_view help;
};

using Labels = std::vector<std::pair<std::string, std::string>>;

// An empty family for `def`.
prometheus::MetricFamily Family(const MetricDef& def);
// Adds one counter or gauge sample (by the family's type) with `labels`.
void AddSample(prometheus::MetricFamily& family, double value, const Labels& labels = {});
// The labels of adjsh_build_info: component, version, revision, cuda (common/build_info.h).
Labels BuildInfoLabels(const std::string& component);
// Adds the current state of `histogram` with `labels`.
void AddHistogram(prometheus::MetricFamily& family, const prometheus::Histogram& histogram,
                  const Labels& labels = {});

// Bucket bounds first, first * factor, ..., count of them.
prometheus::Histogram::BucketBoundaries ExponentialBuckets(double first, double factor,
                                                           int count);

// The memory this process may use: the cgroup limit (v2 memory.max, v1
// memory.limit_in_bytes) when one is set and smaller than physical memory, else physical memory.
uint64_t MemoryLimitBytes();

// The text exposition (format 0.0.4) of everything `collectables` export, in order.
std::string Exposition(const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables);

// HTTP/1.1 on one thread, one connection at a time, each closed after its answer (a scrape
// every few seconds needs no more): GET /metrics answers the exposition, GET / a pointer to
// it, other paths 404, other methods 405. A client gets 5 s to send its request.
class MetricsServer {
 public:
  // Serves on `listen` (HOST:PORT; port 0 picks a free one; HOST a name or an IPv4/IPv6
  // address, "0.0.0.0" for every interface). UNAVAILABLE when the address cannot be bound,
  // INVALID_ARGUMENT when it is malformed.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen);
  ~MetricsServer();  // stops serving: within 100 ms, or 5 s while a silent client holds it

  // Exports `collectable` from now on; the server keeps it alive.
  void Add(std::shared_ptr<prometheus::Collectable> collectable);
  // HOST:PORT actually bound (the free port when 0 was asked for).
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  void Serve();
  void Answer(int fd);

  int listen_fd_ = -1;
  std::string address_;
  std::mutex mu_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;  // guarded by mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace adjsh::metrics

#endif  // ADJSH_COMMON_METRICS_SERVER_H_
