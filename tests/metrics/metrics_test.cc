// The metrics of the worker and the coordinator, their HTTP endpoint, and the tie between the
// code and deploy/: every family a class exports is in its table (Definitions()) and every table
// entry is exported (given a running job, a GPU probe); the worker's options taken from its
// backend (device label, memory probe); every adjsh metric the Grafana dashboards and the
// Prometheus rules (and their tests) name is in those tables.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/metrics_server.h"
#include "common/proc_stats.h"
#include "coordinator/job_service.h"
#include "coordinator/metrics.h"
#include "coordinator/task_service.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/kept_pool.h"
#include "tests/common/test_util.h"
#include "worker/metrics.h"

namespace adjsh {
namespace {

using ::adjsh::testing::StatusIs;
namespace fs = std::filesystem;

std::set<std::string> Names(const std::vector<metrics::MetricDef>& defs) {
  std::set<std::string> out;
  for (const auto& d : defs) out.insert(std::string(d.name));
  return out;
}

std::map<std::string, prometheus::MetricFamily> ByName(
    const std::vector<prometheus::MetricFamily>& families) {
  std::map<std::string, prometheus::MetricFamily> out;
  for (const auto& f : families) {
    EXPECT_FALSE(out.contains(f.name)) << "family exported twice: " << f.name;
    out[f.name] = f;
  }
  return out;
}

std::set<std::string> Keys(const std::map<std::string, prometheus::MetricFamily>& m) {
  std::set<std::string> out;
  for (const auto& [k, v] : m) out.insert(k);
  return out;
}

std::string Label(const prometheus::ClientMetric& m, const std::string& name) {
  for (const auto& l : m.label)
    if (l.name == name) return l.value;
  return "<absent>";
}

// Every family has samples, the conventional suffix for its type, and the adjsh_ prefix.
void ExpectConventional(const std::map<std::string, prometheus::MetricFamily>& families) {
  for (const auto& [name, f] : families) {
    EXPECT_FALSE(f.metric.empty()) << name;
    EXPECT_EQ(name.rfind("adjsh_", 0), 0u) << name;
    EXPECT_FALSE(f.help.empty()) << name;
    const bool total = name.size() > 6 && name.substr(name.size() - 6) == "_total";
    EXPECT_EQ(total, f.type == prometheus::MetricType::Counter) << name;
  }
}

// A pooled set for the kept-activations gauge (kernels/cpu/kept_pool.h).
struct KeptBlob {
  std::vector<char> v;
  int64_t bytes() const { return static_cast<int64_t>(v.capacity()); }
};

TEST(WorkerMetricsTest, ExportsItsTableAndCountsTasks) {
  worker::WorkerMetrics m({.device = "cpu", .name = "w0", .device_memory = {}});
  KeptBlob* kept = cpu::KeptPool<KeptBlob>::Get().Take(12345);  // counted while held
  ASSERT_NE(kept, nullptr);
  m.TaskDone(0.5, 256, 1000, 2000, /*accepted=*/false);
  m.TaskDone(0.003, 64, 10, 20, /*accepted=*/true);
  m.TaskFailed(7);
  const auto f = ByName(m.Collect());
  std::set<std::string> expected = Names(worker::WorkerMetrics::Definitions());
  expected.erase("adjsh_worker_gpu_memory_used_bytes");  // no probe: no GPU series
  expected.erase("adjsh_worker_gpu_memory_peak_bytes");
  for (const char* c : {"h2d_bytes", "d2h_bytes", "h2d_copies", "d2h_copies", "syncs",
                        "allocations"})
    expected.erase(absl::StrCat("adjsh_worker_device_", c, "_total"));
  EXPECT_EQ(Keys(f), expected);
  ExpectConventional(f);
  const prometheus::ClientMetric& build = f.at("adjsh_build_info").metric.at(0);
  EXPECT_EQ(Label(build, "component"), "worker");
  EXPECT_EQ(Label(build, "version"), kAdjshVersion);
  EXPECT_FALSE(Label(build, "revision").empty());
  auto value = [&](const std::string& name) {
    const prometheus::ClientMetric& c = f.at(name).metric.at(0);
    EXPECT_EQ(Label(c, "device"), "cpu") << name;
    return f.at(name).type == prometheus::MetricType::Counter ? c.counter.value : c.gauge.value;
  };
  EXPECT_EQ(value("adjsh_worker_tasks_done_total"), 2);
  EXPECT_EQ(value("adjsh_worker_tasks_failed_total"), 1);
  EXPECT_EQ(value("adjsh_worker_results_rejected_total"), 1);
  EXPECT_EQ(value("adjsh_worker_tokens_processed_total"), 320);
  EXPECT_EQ(value("adjsh_worker_received_bytes_total"), 1017);
  EXPECT_EQ(value("adjsh_worker_sent_bytes_total"), 2020);
  EXPECT_EQ(value("adjsh_worker_info"), 1);
  EXPECT_EQ(Label(f.at("adjsh_worker_info").metric[0], "worker"), "w0");
  const prometheus::ClientMetric& h = f.at("adjsh_worker_task_duration_seconds").metric.at(0);
  EXPECT_EQ(h.histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(h.histogram.sample_sum, 0.503);
  // Read at the scrape: within 10% of VmRSS read just after.
  const double rss = value("adjsh_worker_resident_memory_bytes");
  EXPECT_NEAR(rss / static_cast<double>(ResidentBytes()), 1.0, 0.1);
  EXPECT_GE(value("adjsh_worker_peak_resident_memory_bytes"), rss * 0.9);
  EXPECT_GT(value("adjsh_worker_memory_limit_bytes"), rss);
  EXPECT_EQ(value("adjsh_worker_kept_activations_bytes"), cpu::KeptBytes());
  EXPECT_GE(value("adjsh_worker_kept_activations_bytes"), 12345);
  cpu::KeptPool<KeptBlob>::Get().Give(kept);
}

TEST(WorkerMetricsTest, GpuGaugesComeFromTheProbeOnly) {
  DeviceTraffic traffic;
  traffic.h2d_bytes = 1000, traffic.d2h_bytes = 2000, traffic.h2d_copies = 3;
  traffic.d2h_copies = 4, traffic.syncs = 5, traffic.allocations = 6;
  std::optional<DeviceMemoryUsage> reading = DeviceMemoryUsage{
      .used_bytes = 3 << 20, .peak_bytes = 5 << 20, .traffic = traffic};
  worker::WorkerMetrics m({.device = "cuda:1", .name = "w", .device_memory = [&] {
                             return reading;
                           }});
  auto f = ByName(m.Collect());
  EXPECT_EQ(Keys(f), Names(worker::WorkerMetrics::Definitions()));
  EXPECT_EQ(f.at("adjsh_worker_gpu_memory_used_bytes").metric.at(0).gauge.value, 3 << 20);
  EXPECT_EQ(f.at("adjsh_worker_gpu_memory_peak_bytes").metric.at(0).gauge.value, 5 << 20);
  EXPECT_EQ(Label(f.at("adjsh_worker_gpu_memory_used_bytes").metric[0], "device"), "cuda:1");
  int want = 1000;  // the traffic's six totals, as counters, in DeviceTraffic's order
  for (const char* c : {"h2d_bytes", "d2h_bytes"}) {
    const auto& family = f.at(absl::StrCat("adjsh_worker_device_", c, "_total"));
    EXPECT_EQ(family.type, prometheus::MetricType::Counter) << c;
    EXPECT_EQ(family.metric.at(0).counter.value, want) << c;
    want += 1000;
  }
  want = 3;
  for (const char* c : {"h2d_copies", "d2h_copies", "syncs", "allocations"})
    EXPECT_EQ(f.at(absl::StrCat("adjsh_worker_device_", c, "_total")).metric.at(0).counter.value,
              want++)
        << c;
  reading.reset();  // no reading right now: the series are left out, not zero
  f = ByName(m.Collect());
  EXPECT_FALSE(f.contains("adjsh_worker_gpu_memory_used_bytes"));
  EXPECT_FALSE(f.contains("adjsh_worker_gpu_memory_peak_bytes"));
  EXPECT_FALSE(f.contains("adjsh_worker_device_h2d_bytes_total"));
}

// A backend standing for a GPU's: only its device and its memory probe are used, the probe
// reading a counter the test sets (as the CUDA backend's reads the device's counts).
class FakeGpuBackend final : public Backend<float> {
 public:
  explicit FakeGpuBackend(std::shared_ptr<std::atomic<uint64_t>> used) : used_(std::move(used)) {
    device_ = *ParseDevice("cuda:2");
    device_.bf16_storage = true;  // not part of the label
  }
  const Device& device() const override { return device_; }
  bool Supports(Op) const override { return false; }
  std::unique_ptr<BlockBackend<float>> MakeBlock(const MambaConfig&,
                                                 const LayerParams<float>&) override {
    return nullptr;
  }
  double HeadForwardBackward(const cpu::LmHeadArgs<float>&, float*, float*, float*) override {
    return 0;
  }
  DeviceMemoryProbe MemoryProbe() const override {
    return [used = used_]() -> std::optional<DeviceMemoryUsage> {
      const uint64_t now = used->load();
      return DeviceMemoryUsage{.used_bytes = now, .peak_bytes = 2 * now, .traffic = {}};
    };
  }

 private:
  Device device_;
  std::shared_ptr<std::atomic<uint64_t>> used_;
};

// The worker command's wiring (cli/worker_cmd.cc): the options come from the backend it computes
// with, the CPU's giving no GPU gauges, a GPU's giving its probe, read at every scrape and still
// after the backend is destroyed.
TEST(WorkerMetricsTest, OptionsForABackendTakeItsDeviceAndItsProbe) {
  absl::StatusOr<std::unique_ptr<Backend<float>>> cpu = MakeBackend<float>(Device{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE((*cpu)->MemoryProbe());
  worker::WorkerMetricsOptions cpu_opt = worker::MetricsOptionsFor("w-cpu", **cpu);
  EXPECT_EQ(cpu_opt.device, "cpu");
  EXPECT_EQ(cpu_opt.name, "w-cpu");
  EXPECT_FALSE(cpu_opt.device_memory);
  cpu->reset();
  auto f = ByName(worker::WorkerMetrics(std::move(cpu_opt)).Collect());
  EXPECT_FALSE(f.contains("adjsh_worker_gpu_memory_used_bytes"));
  EXPECT_FALSE(f.contains("adjsh_worker_gpu_memory_peak_bytes"));
  EXPECT_EQ(Label(f.at("adjsh_worker_info").metric.at(0), "device"), "cpu");

  auto used = std::make_shared<std::atomic<uint64_t>>(7 << 20);
  auto gpu = std::make_unique<FakeGpuBackend>(used);
  worker::WorkerMetrics m(worker::MetricsOptionsFor("w-gpu", *gpu));
  gpu.reset();
  f = ByName(m.Collect());
  ASSERT_EQ(Keys(f), Names(worker::WorkerMetrics::Definitions()));
  const prometheus::ClientMetric& g = f.at("adjsh_worker_gpu_memory_used_bytes").metric.at(0);
  EXPECT_EQ(Label(g, "device"), "cuda:2");
  EXPECT_EQ(g.gauge.value, 7 << 20);
  EXPECT_EQ(f.at("adjsh_worker_gpu_memory_peak_bytes").metric.at(0).gauge.value, 14 << 20);
  used->store(9 << 20);
  f = ByName(m.Collect());
  EXPECT_EQ(f.at("adjsh_worker_gpu_memory_used_bytes").metric.at(0).gauge.value, 9 << 20);
}

TEST(CoordinatorMetricsTest, ExportsItsTableAndTheRunningJob) {
  coordinator::TaskServiceImpl tasks;
  coordinator::CoordinatorMetrics m(&tasks);
  coordinator::JobServiceOptions options;
  options.threads = 1;
  options.observer = &m;
  coordinator::JobServiceImpl jobs(tasks, options);
  m.set_jobs(&jobs);
  const std::set<std::string> per_job = {
      "adjsh_coordinator_job_step", "adjsh_coordinator_job_steps", "adjsh_coordinator_loss",
      "adjsh_coordinator_tokens_per_second", "adjsh_coordinator_last_progress_timestamp_seconds",
      "adjsh_coordinator_grad_norm", "adjsh_coordinator_learning_rate",
      "adjsh_coordinator_val_loss", "adjsh_coordinator_job_expected_workers"};
  // The step profile's gauges appear with the first span-scheduled step and stay.
  const std::set<std::string> per_step = {
      "adjsh_coordinator_step_task_seconds", "adjsh_coordinator_step_critical_path_seconds",
      "adjsh_coordinator_step_parallelism", "adjsh_coordinator_step_wire_bytes"};
  std::set<std::string> idle = Names(coordinator::CoordinatorMetrics::Definitions());
  for (const std::string& n : per_job) idle.erase(n);
  for (const std::string& n : per_step) idle.erase(n);

  auto f = ByName(m.Collect());
  EXPECT_EQ(Keys(f), idle);
  ExpectConventional(f);
  std::set<std::string> states;
  for (const auto& c : f.at("adjsh_coordinator_jobs").metric) states.insert(Label(c, "state"));
  EXPECT_EQ(states, (std::set<std::string>{"queued", "running", "succeeded", "failed",
                                           "cancelled"}));
  states.clear();
  for (const auto& c : f.at("adjsh_coordinator_tasks").metric) states.insert(Label(c, "state"));
  EXPECT_EQ(states, (std::set<std::string>{"waiting", "ready", "leased", "done"}));

  m.JobStarted("job-7", 3, 10, 4);  // resumed at step 3: no loss yet; 4 workers expected
  f = ByName(m.Collect());
  EXPECT_EQ(f.at("adjsh_coordinator_job_expected_workers").metric.at(0).gauge.value, 4);
  EXPECT_EQ(Label(f.at("adjsh_coordinator_job_expected_workers").metric[0], "job_id"), "job-7");
  EXPECT_EQ(f.at("adjsh_coordinator_job_step").metric.at(0).gauge.value, 3);
  EXPECT_EQ(Label(f.at("adjsh_coordinator_job_step").metric[0], "job_id"), "job-7");
  EXPECT_FALSE(f.contains("adjsh_coordinator_loss"));
  train::StepReport r;
  r.step = 4, r.steps = 10, r.loss = 2.5, r.seconds = 0.25, r.tokens_per_s = 8192;
  r.grad_norm = 0.75, r.lr = 1e-3, r.evaluated = true, r.val_loss = 2.75;
  r.profile.tasks = 120, r.profile.task_seconds = 8.5, r.profile.critical_path_seconds = 1.25;
  r.profile.parallelism = 6.8, r.profile.wire_bytes = 23600000;
  m.StepDone("job-7", r, 2048);
  f = ByName(m.Collect());
  EXPECT_EQ(Keys(f), Names(coordinator::CoordinatorMetrics::Definitions()));
  EXPECT_EQ(f.at("adjsh_coordinator_step_task_seconds").metric.at(0).gauge.value, 8.5);
  EXPECT_EQ(f.at("adjsh_coordinator_step_critical_path_seconds").metric.at(0).gauge.value, 1.25);
  EXPECT_EQ(f.at("adjsh_coordinator_step_parallelism").metric.at(0).gauge.value, 6.8);
  EXPECT_EQ(f.at("adjsh_coordinator_step_wire_bytes").metric.at(0).gauge.value, 23600000);
  EXPECT_EQ(f.at("adjsh_coordinator_loss").metric.at(0).gauge.value, 2.5);
  EXPECT_EQ(f.at("adjsh_coordinator_grad_norm").metric.at(0).gauge.value, 0.75);
  EXPECT_EQ(f.at("adjsh_coordinator_learning_rate").metric.at(0).gauge.value, 1e-3);
  EXPECT_EQ(f.at("adjsh_coordinator_val_loss").metric.at(0).gauge.value, 2.75);
  EXPECT_EQ(f.at("adjsh_coordinator_job_step").metric.at(0).gauge.value, 4);
  EXPECT_EQ(f.at("adjsh_coordinator_job_steps").metric.at(0).gauge.value, 10);
  EXPECT_EQ(f.at("adjsh_coordinator_tokens_per_second").metric.at(0).gauge.value, 8192);
  EXPECT_EQ(f.at("adjsh_coordinator_tokens_total").metric.at(0).counter.value, 2048);
  EXPECT_EQ(f.at("adjsh_coordinator_steps_total").metric.at(0).counter.value, 1);
  EXPECT_EQ(f.at("adjsh_coordinator_step_duration_seconds").metric.at(0).histogram.sample_count,
            1u);
  m.JobEnded("job-7");
  f = ByName(m.Collect());
  std::set<std::string> after = idle;
  after.insert(per_step.begin(), per_step.end());
  EXPECT_EQ(Keys(f), after);
  EXPECT_EQ(f.at("adjsh_coordinator_steps_total").metric.at(0).counter.value, 1);
  m.JobStarted("job-8", 0, 5, 0);  // no workers stated: no expectation exported
  f = ByName(m.Collect());
  EXPECT_TRUE(f.contains("adjsh_coordinator_job_step"));
  EXPECT_FALSE(f.contains("adjsh_coordinator_job_expected_workers"));
}

// One HTTP exchange with 127.0.0.1:port; the whole answer.
std::string Http(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  }
  close(fd);
  return out;
}

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  return port;
}

TEST(MetricsServerTest, ServesTheExposition) {
  absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> s =
      metrics::MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(s.ok()) << s.status();
  auto m = std::make_shared<worker::WorkerMetrics>(
      worker::WorkerMetricsOptions{.device = "cpu", .name = "w0", .device_memory = {}});
  m->TaskDone(0.01, 100, 1, 2, true);
  (*s)->Add(m);
  const int port = PortOf((*s)->address());
  ASSERT_GT(port, 0);
  const std::string ok = Http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(ok.find("\nadjsh_worker_tokens_processed_total{device=\"cpu\"} 100\n"),
            std::string::npos)
      << ok;
  EXPECT_NE(ok.find("# TYPE adjsh_worker_task_duration_seconds histogram"), std::string::npos);
  const size_t body = ok.find("\r\n\r\n") + 4;
  const std::string length = "Content-Length: " + std::to_string(ok.size() - body) + "\r\n";
  EXPECT_NE(ok.find(length), std::string::npos) << ok.substr(0, body);
  EXPECT_EQ(Http(port, "GET /nope HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Http(port, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(Http(port, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);

  // The port is taken now.
  EXPECT_TRUE(StatusIs(metrics::MetricsServer::Start((*s)->address()),
                       absl::StatusCode::kUnavailable, "cannot serve metrics on"));
}

TEST(MetricsServerTest, RefusesMalformedAddresses) {
  for (const char* bad : {"", "9100", ":9100", "127.0.0.1:", "127.0.0.1:x", "127.0.0.1:65536",
                          "127.0.0.1:-1"}) {
    EXPECT_TRUE(StatusIs(metrics::MetricsServer::Start(bad), absl::StatusCode::kInvalidArgument,
                         "--metrics-listen must be HOST:PORT"))
        << bad;
  }
  EXPECT_TRUE(StatusIs(metrics::MetricsServer::Start("no-such-host.invalid:0"),
                       absl::StatusCode::kUnavailable, "no-such-host"));
}

// The adjsh metric names in `text` that are not in `known` (the series _bucket, _sum and _count
// of a family in `histograms` count as that family).
std::set<std::string> Unknown(const std::string& text, const std::set<std::string>& known,
                              const std::set<std::string>& histograms) {
  static const std::regex kName("adjsh_[a-z0-9_]*[a-z0-9]");
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kName);
       it != std::sregex_iterator(); ++it) {
    std::string name = it->str();
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (name.size() > s.size() && name.ends_with(s) &&
          histograms.contains(name.substr(0, name.size() - s.size()))) {
        name = name.substr(0, name.size() - s.size());
      }
    }
    if (!known.contains(name)) out.insert(name);
  }
  return out;
}

TEST(DeployTest, CheckerFlagsUnknownNames) {
  const std::set<std::string> known = {"adjsh_a_seconds", "adjsh_b_total"};
  const std::set<std::string> histograms = {"adjsh_a_seconds"};
  EXPECT_EQ(Unknown("rate(adjsh_a_seconds_bucket[1m]) + adjsh_b_total", known, histograms),
            std::set<std::string>{});
  EXPECT_EQ(Unknown("adjsh_b_total / adjsh_c_bytes", known, histograms),
            std::set<std::string>{"adjsh_c_bytes"});
  EXPECT_EQ(Unknown("adjsh_b_total_sum", known, histograms),
            std::set<std::string>{"adjsh_b_total_sum"});
}

TEST(DeployTest, DashboardsAndRulesUseExportedMetricsOnly) {
  std::set<std::string> known, histograms;
  for (const auto* defs : {&worker::WorkerMetrics::Definitions(),
                           &coordinator::CoordinatorMetrics::Definitions()}) {
    for (const metrics::MetricDef& d : *defs) {
      known.insert(std::string(d.name));
      if (d.kind == metrics::Kind::kHistogram) histograms.insert(std::string(d.name));
    }
  }
  const fs::path deploy = fs::path(ADJSH_SOURCE_DIR) / "deploy";
  std::vector<fs::path> files = {deploy / "prometheus" / "rules.yml",
                                 deploy / "prometheus" / "tests" / "rules_test.yml"};
  for (const auto& e : fs::directory_iterator(deploy / "grafana" / "dashboards")) {
    files.push_back(e.path());
  }
  ASSERT_GE(files.size(), 5u);
  for (const fs::path& p : files) {
    std::ifstream in(p);
    ASSERT_TRUE(in) << p;
    std::stringstream text;
    text << in.rdbuf();
    ASSERT_FALSE(text.str().empty()) << p;
    EXPECT_EQ(Unknown(text.str(), known, histograms), std::set<std::string>{})
        << p << " uses metrics that adjsh does not export";
  }
}

}  // namespace
}  // namespace adjsh
