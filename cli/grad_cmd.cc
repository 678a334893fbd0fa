// adjsh grad: loss and gradient of the mean next-token loss of one sequence (docs/USAGE.md
// "adjsh grad").
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device_flags.h"
#include "cli/grad_output.h"
#include "common/token_data.h"
#include "common/model.h"
#include "coordinator/local_cluster.h"
#include "common/tokens.h"
#include "engine/adjoint_engine.h"
#include "engine/capabilities.h"
#include "engine/families/families.h"
#include "engine/segments.h"
#include "engine/span_plan.h"
#include "engine/step_profile.h"

namespace adjsh::cli {
namespace {

// The gradient of the model type F in precision T: in-process, on local workers (f32), or per
// document piece (Mamba-1's --doc-starts); what F cannot do was refused by Supports.
template <typename F, typename T>
absl::Status RunGrad(const ArgParser& a, const GradOptions& opt, bool quiet, int workers,
                     std::vector<std::string> worker_devices) {
  using Result = typename F::template GradOf<T>;
  absl::StatusOr<typename F::template Params<T>> params = F::template Load<T>(a.Get("model"));
  if (!params.ok()) return params.status();
  absl::StatusOr<std::vector<uint32_t>> tokens = ReadTokenFile(a.Get("tokens"));
  if (!tokens.ok()) return tokens.status();
  if (absl::Status s = CheckTokensInVocab(*tokens, params->config.vocab_size); !s.ok()) return s;

  std::vector<int64_t> doc_starts;
  if (a.Has("doc-starts")) {
    absl::StatusOr<std::vector<int64_t>> starts =
        ReadTokenOffsets(a.Get("doc-starts"), static_cast<int64_t>(tokens->size()));
    if (!starts.ok()) return starts.status();
    doc_starts = *std::move(starts);
  }
  const auto start = std::chrono::steady_clock::now();
  const auto since_start = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // The gradient's time: with workers, from after they registered until the result is in (not
  // the cluster's start, nor its stop when it goes out of scope).
  double seconds = -1;
  absl::StatusOr<Result> result;
  // The masked model's pieces; none for a sequence too short for a target, which the plain
  // path below refuses by name.
  const std::vector<std::pair<int64_t, int64_t>> pieces =
      doc_starts.empty() ? std::vector<std::pair<int64_t, int64_t>>()
                         : PiecesAtStarts(static_cast<int64_t>(tokens->size()), doc_starts);
  if (!pieces.empty()) {  // the masked model: its documents' pieces, combined
    std::vector<Result> parts;
    for (const auto& [first, len] : pieces) {
      absl::StatusOr<Result> g =
          F::Gradient(*params, GradPiece{std::span(*tokens).subspan(first, len), opt});
      if (!g.ok()) return g.status();
      parts.push_back(*std::move(g));
    }
    result = CombineGradients<T>(std::move(parts));
  } else if constexpr (std::is_same_v<T, float>) {
    if (workers > 0) {  // a local cluster: every task on worker processes
      coordinator::LocalClusterOptions options;
      options.worker_devices = std::move(worker_devices);
      options.kept_budget = opt.device.kept_budget;
      options.row_budget = opt.device.row_budget;
      options.service.trace_path = a.Get("trace");
      options.service.worker_tree = *ReduceFromFlags(a);  // checked by GradCommand
      absl::StatusOr<std::unique_ptr<coordinator::LocalCluster>> cluster =
          coordinator::LocalCluster::Start(workers, SelfExe(), std::move(options));
      if (!cluster.ok()) return cluster.status();
      // Start waited for the workers to register.
      const double registered = since_start();
      result = (*cluster)->service().ComputeGradient(*params, *tokens, opt, "grad", 0);
      seconds = since_start() - registered;
    }
  }
  if (workers == 0 && pieces.empty()) result = F::Gradient(*params, GradPiece{*tokens, opt});
  if (!result.ok()) return result.status();
  if (workers == 0 && a.Has("trace") && result->profile.tasks > 0) {
    absl::StatusOr<SpanPlan> plan =
        SpanPlan::Make(static_cast<int64_t>(tokens->size()), opt.chunk, opt.spans,
                       params->config.num_hidden_layers, params->config.conv_kernel);
    if (!plan.ok()) return plan.status();
    if (absl::Status s = AppendTrace(a.Get("trace"), *plan, 0, result->records); !s.ok())
      return s;
  }
  if (seconds < 0) seconds = since_start();

  const DType dtype = std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
  if (absl::Status s = WriteGradOutput(a.Get("out"), F::ToTensors(result->grad, dtype),
                                       result->loss, dtype);
      !s.ok())
    return s;
  if (!quiet) {
    const std::string where =
        workers == 0 ? "in-process" : absl::StrCat(workers, workers == 1 ? " worker" : " workers");
    PrintGradSummary(result->loss, tokens->size(), seconds, a.Get("out"),
                     absl::StrCat("(", F::kLabel, ", ", where, ")"));
    if (result->profile.tasks > 0)
      std::fprintf(stderr, "%s\n", ProfileSummary(result->profile).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int GradCommand(const std::vector<std::string>& args) {
  ArgParser a("grad",
              "Computes the loss and the exact gradient (or, with --window, the truncated-adjoint\n"
              "gradient) of the mean next-token loss of one token sequence, by adjoint sharding:\n"
              "the sequence is cut into spans of whole chunks, whose (layer, span) tasks run on\n"
              "local threads, or on local worker processes with --workers. The output holds one\n"
              "tensor per parameter (HF names and shapes) and the scalar 'loss'.");
  a.Add("model", "DIR", "model directory: config.json + model.safetensors", "", true);
  a.Add("tokens", "FILE", "token ids, raw little-endian .u32 or .u16", "", true);
  a.Add("out", "FILE", "output .safetensors file", "", true);
  a.Add("window", "Wt", "truncated adjoint window in tokens (default: exact gradient)");
  a.Add("cotangent", "exact|top-of-stack",
        "each layer's output cotangent: exact, or dL/du^{K+1} for every layer (the paper's "
        "Proposition 3, an approximation for K > 1; in-process only)",
        "exact");
  a.Add("chunk", "C", "tokens per chunk (one kernel call)", "256");
  a.Add("spans", "S",
        "spans of the sequence (the span schedule; default: about T/16384, at least 8, at most "
        "one per chunk). The result depends on S, never on threads or workers",
        "0");
  a.Add("trace", "FILE", "append one JSON line per span task (bench/fleet_sim.py reads them)");
  a.Add("doc-starts", "FILE",
        "document starts in the sequence (raw little-endian uint64 offsets, ascending): the "
        "recurrence and the conv do not cross them (the exact gradient of that masked model; "
        "in-process)");
  a.Add("threads", "N", "threads for in-process work (0: one per core)", "0");
  a.Add("workers", "N",
        "local worker processes owning the spans, on a private Unix socket (0: all "
        "in-process; f32, exact, span schedule)",
        "0");
  AddWorkerDeviceFlag(a);
  AddReduceFlag(a, "with --workers: ");
  a.Add("schedule", "spans|wavefront|two-pass",
        "spans (what workers run), or the in-process chunk schedules: a wavefront over (layer, "
        "chunk), or two passes per layer with all chunks in parallel",
        "spans");
  a.Add("dtype", "f32|f64", "compute and output precision (f64: the check mode)", "f32");
  a.Add("storage", "full|bf16",
        "the layer inputs and chunk states kept for the backward: in the compute precision, "
        "or rounded to bf16 (half the bytes of f32)",
        "full");
  a.Add("spill-dir", "DIR",
        "keep the layer inputs in memory-mapped files here (the OS may write them to disk)");
  AddDeviceFlags(a, "the forward, head and backward tasks in-process");
  AddKeptFlag(a);
  AddDeviceMemFlag(a);
  a.AddBool("quiet", "print nothing on success");
  if (auto code = ParseOrExit(a, args)) return *code;

  GradOptions opt;
  absl::StatusOr<Device> device = DeviceFromFlags(a);
  if (!device.ok()) return BadUsage("grad", device.status());
  opt.device = *device;
  absl::StatusOr<int64_t> chunk = a.GetInt("chunk", 1, int64_t{1} << 40);
  if (!chunk.ok()) return BadUsage("grad", chunk.status());
  opt.chunk = *chunk;
  if (a.Has("window")) {
    absl::StatusOr<int64_t> window = a.GetInt("window", 1, int64_t{1} << 40);
    if (!window.ok()) return BadUsage("grad", window.status());
    opt.window = *window;
  }
  absl::StatusOr<Cotangent> cotangent = CotangentFromName(a.Get("cotangent"));
  if (!cotangent.ok()) return BadUsage("grad", cotangent.status());
  opt.cotangent = *cotangent;
  absl::StatusOr<int64_t> threads = a.GetInt("threads", 0, 4096);
  if (!threads.ok()) return BadUsage("grad", threads.status());
  opt.threads = static_cast<int>(*threads);
  opt.spill_dir = a.Get("spill-dir");
  absl::StatusOr<Storage> storage = StorageFromFlags(a);
  if (!storage.ok()) return BadUsage("grad", storage.status());
  opt.storage = *storage;  // on a GPU also its activations and weights
  opt.device.bf16_storage = opt.storage == Storage::kBF16 && !opt.device.is_cpu();
  absl::StatusOr<int64_t> workers = a.GetInt("workers", 0, 1024);
  if (!workers.ok()) return BadUsage("grad", workers.status());
  absl::StatusOr<Schedule> schedule = ScheduleFromName(a.Get("schedule"));
  if (!schedule.ok()) return BadUsage("grad", schedule.status());
  opt.schedule = *schedule;
  absl::StatusOr<int64_t> spans = a.GetInt("spans", 0, int64_t{1} << 30);
  if (!spans.ok()) return BadUsage("grad", spans.status());
  opt.spans = *spans;
  const bool quiet = a.GetBool("quiet");
  if (!quiet) {
    opt.progress = [](std::string_view phase, int64_t done, int64_t total) {
      std::fprintf(stderr, "  %-8s %lld/%lld\n", std::string(phase).c_str(),
                   static_cast<long long>(done), static_cast<long long>(total));
    };
  }
  const std::string dtype = a.Get("dtype");
  if (dtype != "f32" && dtype != "f64") {
    return BadUsage("grad", absl::InvalidArgumentError("--dtype must be f32 or f64, got '" +
                                                       dtype + "'"));
  }
  if (absl::Status s = CheckOutputFile("out", a.Get("out")); !s.ok()) return BadUsage("grad", s);
  // The gradient must not replace what it reads: the token files, and the model's config,
  // index and weights (model.safetensors, or any shard: every .safetensors of its folder).
  const std::filesystem::path model = a.Get("model");
  if (absl::Status s = CheckOutputIsNotInput(
          "out", a.Get("out"),
          {{"the --tokens file", a.Get("tokens")},
           {"the --doc-starts file", a.Has("doc-starts") ? a.Get("doc-starts") : ""},
           {"the model's config", (model / "config.json").string()},
           {"the model's weight index", (model / "model.safetensors.index.json").string()}});
      !s.ok()) {
    return BadUsage("grad", s);
  }
  {
    std::error_code e1, e2;
    const std::filesystem::path out = std::filesystem::weakly_canonical(a.Get("out"), e1);
    if (!e1 && out.extension() == ".safetensors" &&
        out.parent_path() == std::filesystem::weakly_canonical(model, e2) && !e2) {
      return BadUsage("grad", absl::InvalidArgumentError(absl::StrCat(
                                  "--out ", a.Get("out"), " is in the model's folder, where "
                                  "its weights are: it could overwrite them")));
    }
  }
  // What this model type can compute where (engine/capabilities.h), before anything runs.
  const ModelType model_type = ModelTypeOfFolder(a.Get("model"));
  RunRequest request{.model = model_type,
                     .runner = *workers > 0 ? Runner::kWorkers : Runner::kInProcess,
                     .f64 = dtype == "f64",
                     .options = opt,
                     .doc_starts = a.Has("doc-starts"),
                     .trace = a.Has("trace")};
  if (absl::Status s = Supports(request); !s.ok()) return BadUsage("grad", s);
  absl::StatusOr<std::vector<std::string>> worker_devices = WorkerDevicesFromFlags(a);
  if (!worker_devices.ok()) return BadUsage("grad", worker_devices.status());
  if (!worker_devices->empty() && *workers == 0) {
    return BadUsage("grad", absl::InvalidArgumentError("--worker-device needs --workers N (N >= 1)"));
  }
  if (absl::StatusOr<bool> tree = ReduceFromFlags(a); !tree.ok()) {
    return BadUsage("grad", tree.status());
  }
  if (a.Given("reduce") && *workers == 0) {  // in-process there are no partials to move
    return BadUsage("grad", absl::InvalidArgumentError("--reduce needs --workers N (N >= 1)"));
  }
  if (absl::Status s = CheckDeviceUsable(opt.device); !s.ok()) return Fail("grad", s);
  const int w = static_cast<int>(*workers);
  const bool f64 = dtype == "f64";
  const absl::Status status = VisitFamily(model_type, [&](auto family) {
    using F = decltype(family);
    return f64 ? RunGrad<F, double>(a, opt, quiet, w, {})
               : RunGrad<F, float>(a, opt, quiet, w, *std::move(worker_devices));
  });
  return status.ok() ? 0 : Fail("grad", status);
}

}  // namespace adjsh::cli
