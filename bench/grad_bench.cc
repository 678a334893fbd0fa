// One gradient of a synthetic model, in-process, with its time, flop rate and memory:
//   grad_bench --impl adjsh|oracle --hidden-size D --layers K --tokens T [--state-size N]
//              [--vocab-size V] [--chunk C] [--window Wt] [--threads N] [--dtype f32|f64]
//              [--device cpu|cuda:N] [--storage full|bf16] [--schedule spans|wavefront|two-pass]
//              [--spans S]
// Prints one JSON object. Peak RSS is per process, so run one measurement per process. On a
// CUDA device the object also has device_peak_bytes: the most GPU memory adjsh held (weights,
// workspaces) during the timed gradients, and device_name. A span-scheduled run also reports
// its fastest gradient's task_seconds, critical_path_s and busy (engine/step_profile.h); they
// are 0 for the other schedules and the oracle, which keep no task profile.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/flops.h"
#include "cli/args.h"
#include "cli/device_flags.h"
#include "common/model.h"
#include "common/proc_stats.h"
#include "engine/adjoint_engine.h"
#include "engine/span_plan.h"
#include "common/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/kept_pool.h"
#include "kernels/reference/mamba_reference.h"
#ifdef ADJSH_HAVE_CUDA
#include "kernels/cuda/device_block.h"
#endif

namespace adjsh::bench {
namespace {

// The integer flags, each checked against its range before anything runs.
struct Counts {
  int64_t tokens = 0, chunk = 0, window = 0, threads = 0, spans = 0, repeat = 0;
};

template <typename T>
int Run(const cli::ArgParser& a, const MambaConfig& config, const Counts& n) {
  const int64_t T_ = n.tokens;
  const ModelParams<T> params = InitParams<T>(config, 1);
  std::mt19937_64 rng(2);
  std::vector<uint32_t> tokens(T_);
  for (auto& t : tokens) t = static_cast<uint32_t>(rng() % config.vocab_size);
  GradOptions opt;
  opt.chunk = n.chunk;
  opt.window = n.window;
  opt.threads = static_cast<int>(n.threads);
  absl::StatusOr<Schedule> schedule = ScheduleFromName(a.Get("schedule"));
  if (!schedule.ok()) {
    std::fprintf(stderr, "grad_bench: %s\n", std::string(schedule.status().message()).c_str());
    return 2;
  }
  opt.schedule = *schedule;
  opt.spans = n.spans;
  const int64_t spans = opt.spans > 0 ? opt.spans
                                      : SpanPlan::DefaultSpans(T_, std::min(opt.chunk, T_),
                                                               config.conv_kernel);
  // With --kept-mib's budget (Device::kept_budget), which every backend of the runs takes.
  absl::StatusOr<Device> device = cli::DeviceFromFlags(a);
  absl::StatusOr<Storage> storage = ParseStorage(a.Get("storage"));
  if (!device.ok() || !storage.ok()) {
    std::fprintf(stderr, "grad_bench: bad --device or --storage\n");
    return 2;
  }
  opt.device = *device;
  opt.storage = *storage;
  opt.device.bf16_storage = *storage == Storage::kBF16 && !device->is_cpu();
  const std::string impl = a.Get("impl");
  if (impl != "adjsh" && impl != "oracle") {
    std::fprintf(stderr, "grad_bench: --impl must be adjsh or oracle\n");
    return 2;
  }
  const int64_t repeat = n.repeat;
  const int64_t rss_before = ResidentBytes();
  double loss = 0, s = 1e300;  // the fastest of `repeat` runs
  // The fastest span-scheduled run's profile (engine/step_profile.h): its tasks' summed time and
  // its critical path, so that busy = task seconds / (seconds x threads) says how much of the
  // threads' time went to tasks rather than waiting for one to become ready.
  StepProfile prof;
  std::string device_fields;
  for (int64_t r = 0; r < repeat; ++r) {
#ifdef ADJSH_HAVE_CUDA
    if (!opt.device.is_cpu() && r == 0 && repeat > 1) {  // a warm-up: CUDA context, cuBLAS
      absl::StatusOr<GradResult<T>> g = ComputeGradient<T>(params, tokens, opt);
      if (!g.ok()) {
        std::fprintf(stderr, "grad_bench: %s\n", std::string(g.status().message()).c_str());
        return 1;
      }
      cuda::ResetPeak(opt.device.index);
    }
#endif
    const auto start = std::chrono::steady_clock::now();
    StepProfile run_prof;
    if (impl == "adjsh") {
      absl::StatusOr<GradResult<T>> g = ComputeGradient<T>(params, tokens, opt);
      if (!g.ok()) {
        std::fprintf(stderr, "grad_bench: %s\n", std::string(g.status().message()).c_str());
        return 1;
      }
      loss = g->loss;
      run_prof = g->profile;
    } else {
      loss = reference::ReferenceGradient<T>(params, tokens, opt.window).loss;
    }
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (took < s) s = took, prof = run_prof;
  }
#ifdef ADJSH_HAVE_CUDA
  if (!opt.device.is_cpu()) {
    device_fields = ", \"device\": \"" + opt.device.ToString() + "\", \"device_name\": \"" +
                    cuda::DeviceName(opt.device.index) + "\", \"device_peak_bytes\": " +
                    std::to_string(cuda::MemoryOf(opt.device.index).peak);
  }
#endif
  // Pass one runs on all chunks but one each way (the first needs no forward summary, the last
  // no adjoint summary); with S spans on all but one span each way.
  const int64_t chunks = (T_ + opt.chunk - 1) / opt.chunk;
  const double pass_one_share = opt.schedule == Schedule::kTwoPass ? double(chunks - 1) / chunks
                                : opt.schedule == Schedule::kSpans  ? double(spans - 1) / spans
                                                                    : 0.0;
  // The share of summarised chunks that kept their activations, over every run above (the
  // same share each time: the budget and the shapes do not change). Read from the store every
  // CPU backend of the runs shared (kernels/backend.h Device::kept_budget): made by the first
  // run, so its counts are these runs' alone.
  const std::shared_ptr<cpu::KeptStore> kept = cpu::KeptStore::Shared(opt.device.kept_budget);
  const cpu::KeptTakes takes = kept->takes();
  const int64_t given = takes.given + takes.carried_to_summary;
  const double kept_share =
      given + takes.refused > 0 ? double(given) / double(given + takes.refused) : 0.0;
  // The carried sets' rows over every row of every layer of every run (the wavefront's chunks
  // are not all C rows long: engine/gradient_step.h ChunkStarts).
  const double carried_share =
      double(takes.carried_rows) / double(repeat * config.num_hidden_layers * T_);
  const FlopsPerToken f = GradientFlopsPerToken(config, opt.window == 0, pass_one_share,
                                                kept_share, carried_share);
  const int64_t peak = PeakResidentBytes();
  const double threads = PoolThreads(opt.threads);
  std::printf(
      "{\"impl\": \"%s\", \"tokens\": %lld, \"hidden_size\": %lld, \"layers\": %lld, "
      "\"dtype\": \"%s\", \"schedule\": \"%s\", \"spans\": %lld, \"chunk\": %lld, \"window\": %lld, \"threads\": %d, \"loss\": %.6f, "
      "\"seconds\": %.4f, \"tokens_per_s\": %.1f, \"model_gflop_per_s\": %.2f, "
      "\"executed_gflop_per_s\": %.2f, \"rss_before_bytes\": %lld, \"peak_rss_bytes\": %lld, "
      "\"bytes_per_token\": %.1f, \"kept_share\": %.3f, \"carried_share\": %.3f, "
      "\"kept_peak_bytes\": %lld, \"task_seconds\": %.4f, \"critical_path_s\": %.4f, "
      "\"busy\": %.3f%s}\n",
      impl.c_str(), static_cast<long long>(T_), static_cast<long long>(config.hidden_size),
      static_cast<long long>(config.num_hidden_layers), sizeof(T) == 4 ? "f32" : "f64",
      a.Get("schedule").c_str(), static_cast<long long>(opt.schedule == Schedule::kSpans ? spans : 0),
      static_cast<long long>(opt.chunk), static_cast<long long>(opt.window), opt.threads, loss, s,
      T_ / s, f.model * T_ / s / 1e9, f.executed * T_ / s / 1e9,
      static_cast<long long>(rss_before), static_cast<long long>(peak),
      double(peak - rss_before) / double(T_), kept_share, carried_share,
      static_cast<long long>(kept->peak_bytes()), prof.task_seconds,
      prof.critical_path_seconds, prof.task_seconds / (s * threads), device_fields.c_str());
  return 0;
}

}  // namespace
}  // namespace adjsh::bench

int main(int argc, char** argv) {
  using adjsh::cli::ArgParser;
  ArgParser a("grad_bench", "One gradient of a synthetic Mamba model; prints a JSON line.");
  a.Add("impl", "adjsh|oracle", "implementation", "adjsh");
  a.Add("hidden-size", "D", "width", "256");
  a.Add("layers", "K", "layers", "4");
  a.Add("state-size", "N", "state size", "16");
  a.Add("vocab-size", "V", "vocabulary", "256");
  a.Add("tokens", "T", "sequence length", "4096");
  a.Add("chunk", "C", "chunk", "256");
  a.Add("window", "Wt", "truncated window (0: exact)", "0");
  a.Add("threads", "N", "threads (0: all)", "0");
  a.Add("dtype", "f32|f64", "precision", "f32");
  a.Add("schedule", "spans|wavefront|two-pass", "task schedule (spans: adjsh's default)", "spans");
  a.Add("spans", "S", "spans for --schedule spans (0: the default for T and the chunk)", "0");
  a.Add("repeat", "R", "gradients to run; the fastest is reported", "1");
  a.Add("device", "cpu|cuda:N", "where the gradient runs", "cpu");
  adjsh::cli::AddKeptFlag(a);
  a.Add("storage", "full|bf16",
        "bf16: layer inputs and states stored in bf16 (and on CUDA activations and weights)",
        "full");
  if (auto code = adjsh::cli::ParseOrExit(a, std::vector<std::string>(argv + 1, argv + argc)))
    return *code;
  // Every integer flag in its range, or a message and exit 2 (never an abort).
  bool bad = false;
  auto get = [&](const char* name, int64_t lo, int64_t hi, auto& out) {
    const absl::StatusOr<int64_t> v = a.GetInt(name, lo, hi);
    if (!v.ok()) {
      adjsh::cli::BadUsage("grad_bench", v.status());
      bad = true;
      return;
    }
    out = static_cast<std::remove_reference_t<decltype(out)>>(*v);
  };
  adjsh::MambaConfig c;
  adjsh::bench::Counts n;
  get("hidden-size", 1, 65536, c.hidden_size);
  get("layers", 1, 1024, c.num_hidden_layers);
  get("state-size", 1, 1024, c.state_size);
  get("vocab-size", 2, 1 << 30, c.vocab_size);
  get("tokens", 2, int64_t{1} << 40, n.tokens);
  get("chunk", 1, int64_t{1} << 40, n.chunk);
  get("window", 0, int64_t{1} << 40, n.window);
  get("threads", 0, 4096, n.threads);
  get("spans", 0, int64_t{1} << 30, n.spans);
  get("repeat", 1, 100, n.repeat);
  // --device and --kept-mib (Device::kept_budget), each refused naming the flag.
  if (const absl::StatusOr<adjsh::Device> d = adjsh::cli::DeviceFromFlags(a); !d.ok()) {
    adjsh::cli::BadUsage("grad_bench", d.status());
    bad = true;
  }
  const std::string dtype = a.Get("dtype");
  if (dtype != "f32" && dtype != "f64") {
    adjsh::cli::BadUsage("grad_bench", absl::InvalidArgumentError(
                                           "--dtype must be f32 or f64, got '" + dtype + "'"));
    bad = true;
  }
  if (bad) return 2;
  c.time_step_rank = (c.hidden_size + 15) / 16;
  return dtype == "f64" ? adjsh::bench::Run<double>(a, c, n) : adjsh::bench::Run<float>(a, c, n);
}
