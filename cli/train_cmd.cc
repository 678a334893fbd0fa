// adjsh train: trains a Mamba LM on a corpus, one long sequence per step, with the exact
// adjoint-sharded gradient (or a truncated window), AdamW, checkpoints and resume.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device_flags.h"
#include "cli/job_flags.h"
#include "cli/stop_signal.h"
#include "cli/train_report.h"
#include "common/address.h"
#include "common/metrics_server.h"
#include "common/model.h"
#include "engine/capabilities.h"
#include "common/mamba2_model.h"
#include "common/token_data.h"
#include "common/tokens.h"
#include "coordinator/job_spec.h"
#include "coordinator/local_cluster.h"
#include "coordinator/metrics.h"
#include "train/trainer.h"

namespace adjsh::cli {
namespace {

// A loss mask file: raw bytes, one per corpus token; non-zero = the target there counts.
absl::StatusOr<std::vector<uint8_t>> LoadLossMask(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return absl::ErrnoToStatus(errno, absl::StrFormat("cannot open loss mask %s", path));
  std::vector<uint8_t> mask;
  uint8_t buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;)
    mask.insert(mask.end(), buf, buf + n);
  const int error = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (error != 0) {
    return absl::ErrnoToStatus(error, absl::StrFormat("cannot read loss mask %s", path));
  }
  return mask;
}

// Runs the trainer (set up, Init done) with the progress line, --log-jsonl and
// --metrics-listen, for either model type; cluster: the local workers, or null in-process.
template <typename P>
int RunTrainer(train::BasicTrainer<P>& trainer, const ArgParser& a, const v1::JobSpec& spec,
               const train::TrainOptions& opt, coordinator::LocalCluster* cluster,
               int64_t workers, int64_t first_step) {
  const auto& c = trainer.params().config;
  std::shared_ptr<coordinator::CoordinatorMetrics> cluster_metrics;
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (a.Has("metrics-listen")) {  // through workers with the task families, else without
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> served =
        metrics::MetricsServer::Start(a.Get("metrics-listen"));
    if (!served.ok()) return Fail("train", served.status());
    metrics_server = std::move(*served);
    cluster_metrics = std::make_shared<coordinator::CoordinatorMetrics>(
        cluster ? &cluster->service() : nullptr);
    metrics_server->Add(cluster_metrics);
    std::fprintf(stderr, "metrics on %s\n", metrics_server->address().c_str());
  }
  std::fprintf(stderr,
               "%smodel D=%lld K=%lld N=%lld V=%lld | context %lld tokens x batch %lld, %s | %s "
               "gradient, chunk %lld | %lld steps%s\n",
               std::is_same_v<P, Mamba2Params<float>> ? "Mamba-2 " : "",
               static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_hidden_layers),
               static_cast<long long>(c.state_size), static_cast<long long>(c.vocab_size),
               static_cast<long long>(opt.context), static_cast<long long>(opt.batch_size),
               std::string(train::DataOrderName(opt.order)).c_str(),
               (std::string(opt.grad.window > 0
                                    ? absl::StrFormat("window-%d", opt.grad.window)
                                    : "exact") +
                (opt.grad.cotangent == Cotangent::kTopOfStack ? " top-of-stack" : "") +
                (opt.grad.schedule == Schedule::kWavefront ? " wavefront" : ""))
                   .c_str(),
               static_cast<long long>(opt.grad.chunk), static_cast<long long>(opt.steps),
               trainer.resumed()
                   ? absl::StrFormat(" | resumed at step %d", trainer.state().step).c_str()
                   : "");
  if (!trainer.resume_note().empty())
    std::fprintf(stderr, "adjsh train: %s\n", trainer.resume_note().c_str());
  std::optional<StepLog> log;
  if (a.Has("log-jsonl")) {
    absl::StatusOr<StepLog> opened = StepLog::Open(a.Get("log-jsonl"));
    if (!opened.ok()) return Fail("train", opened.status());
    log.emplace(*std::move(opened));
  }
  if (cluster_metrics) {  // the workers expected: the spec's, else the local cluster's
    cluster_metrics->JobStarted("train", trainer.state().step, opt.steps,
                                spec.expected_workers() > 0 ? spec.expected_workers() : workers);
  }
  // Ctrl-C or SIGTERM: the step under way ends, its state is saved, and the run stops (a
  // second signal ends the process at once: cli/stop_signal.h).
  std::atomic<bool>& stop = InstallStopSignals();
  bool told = false;
  const absl::Status trained = trainer.Run(
      [&](const train::StepReport& r) {
        if (cluster_metrics) cluster_metrics->StepDone("train", r, opt.context);
        PrintProgress(r);
        if (log) log->Write(r);
        if (stop.load() && !std::exchange(told, true))
          std::fprintf(stderr, "adjsh train: stopping: saving step %lld\n",
                       static_cast<long long>(r.step));
      },
      &stop);
  if (log && !log->status().ok()) return Fail("train", log->status());
  if (cluster_metrics) cluster_metrics->JobEnded("train");
  if (!trained.ok()) return Fail("train", trained);
  if (cluster) {
    const double token_steps = static_cast<double>(opt.context) *
                               static_cast<double>(trainer.state().step - first_step);
    const double sent = static_cast<double>(cluster->service().bytes_sent());
    const double received = static_cast<double>(cluster->service().bytes_received());
    std::fprintf(stderr,
                 "wire: %.1f MiB to workers, %.1f MiB back; per token per step %.0f B out, "
                 "%.0f B back; %lld results accepted, %lld refused, %d worker restarts\n",
                 sent / 1048576, received / 1048576, sent / std::max(1.0, token_steps),
                 received / std::max(1.0, token_steps),
                 static_cast<long long>(cluster->service().results_accepted()),
                 static_cast<long long>(cluster->service().results_rejected()),
                 cluster->restarts());
  }
  std::fprintf(stderr, "done: step %lld, loss %.4f; checkpoint in %s/latest\n",
               static_cast<long long>(trainer.state().step), trainer.state().last_loss,
               opt.checkpoint_dir.c_str());
  return 0;
}

// Runs the trainer with its gradients and held-out loss on a local cluster of `workers` worker
// processes (lease, trace, reduction, worker metrics, devices and logs from the flags), for
// either model type.
template <typename P>
int RunOnWorkers(train::BasicTrainer<P>& trainer, const ArgParser& a, const v1::JobSpec& spec,
                 const train::TrainOptions& opt, int64_t workers, int64_t lease_ms,
                 std::vector<std::string> worker_devices) {
  // (A device for the coordinator, which computes nothing, was refused by Supports.)
  coordinator::LocalClusterOptions cluster_options;
  cluster_options.service.lease = absl::Milliseconds(lease_ms);
  cluster_options.service.trace_path = a.Get("trace");
  absl::StatusOr<bool> tree = ReduceFromFlags(a);
  if (!tree.ok()) return BadUsage("train", tree.status());
  cluster_options.service.worker_tree = *tree;
  cluster_options.worker_metrics = a.Get("worker-metrics-listen");
  cluster_options.worker_devices = std::move(worker_devices);
  cluster_options.kept_budget = opt.grad.device.kept_budget;
  cluster_options.row_budget = opt.grad.device.row_budget;
  const std::string log_dir =
      a.Has("worker-log-dir") ? a.Get("worker-log-dir") : opt.checkpoint_dir + "/worker-logs";
  if (log_dir != "-") cluster_options.log_dir = log_dir;
  absl::StatusOr<std::unique_ptr<coordinator::LocalCluster>> started =
      coordinator::LocalCluster::Start(static_cast<int>(workers), SelfExe(),
                                       std::move(cluster_options));
  if (!started.ok()) return Fail("train", started.status());
  std::unique_ptr<coordinator::LocalCluster> cluster = std::move(*started);
  std::fprintf(stderr, "coordinator on %s with %lld worker processes\n",
               cluster->address().c_str(), static_cast<long long>(workers));
  int64_t step = trainer.state().step;
  const int64_t first_step = step;
  // The gradients, and the held-out loss (forward-only steps), on the workers.
  const train::GradientSourceFor<P> on_workers = [&](const P& p,
                                                     std::span<const GradPiece> pieces) {
    return cluster->service().ComputeGradients(p, pieces, "train", step++);
  };
  trainer.set_gradient_source(on_workers);
  trainer.set_evaluation_source(on_workers);
  return RunTrainer(trainer, a, spec, opt, cluster.get(), workers, first_step);
}

// adjsh train for a model of family F (engine/families/family.h): in-process (on the options'
// device), or on local workers (on worker_devices; the worker tree or the star); the options
// its gradient lacks refused by the trainer (engine/capabilities.h).
template <typename F>
int TrainFamily(const ArgParser& a, const v1::JobSpec& spec, const train::TrainOptions& opt_in,
                int64_t workers, int64_t lease_ms, std::vector<std::string> worker_devices) {
  train::TrainOptions opt = opt_in;
  absl::StatusOr<typename F::template Params<float>> params = coordinator::JobParams<F>(spec);
  if (!params.ok()) return Fail("train", params.status());
  absl::StatusOr<coordinator::JobDataSet> data =
      coordinator::JobData(spec, coordinator::NoJobLimits(), params->config.vocab_size);
  if (!data.ok()) return Fail("train", data.status());
  if (opt.reset_at_documents) {
    opt.doc_starts = std::move(data->doc_starts);
    opt.val_doc_starts = std::move(data->val_doc_starts);
  }
  train::BasicTrainer<typename F::template Params<float>> trainer(*std::move(params),
                                                                  std::move(data->corpus), opt);
  if (data->val) trainer.set_validation(*std::move(data->val));
  if (absl::Status s = trainer.Init(); !s.ok()) return Fail("train", s);
  if (workers == 0) return RunTrainer(trainer, a, spec, opt, nullptr, 0, trainer.state().step);
  return RunOnWorkers(trainer, a, spec, opt, workers, lease_ms, std::move(worker_devices));
}

}  // namespace

int TrainCommand(const std::vector<std::string>& args) {
  ArgParser a("train",
              "Trains a Mamba LM: each step takes --batch-size sequences of --context tokens of\n"
              "the corpus, computes the exact gradient by adjoint sharding on local threads or\n"
              "local worker processes (or, in-process, the truncated adjoint with --window), and\n"
              "applies AdamW with warmup, cosine decay and global gradient clipping. Checkpoints\n"
              "go to --checkpoint-dir; a run started again with the same directory resumes from\n"
              "its latest checkpoint. Without --model, a new model is made from the shape flags;\n"
              "without --data/--tokens/--text, the corpus is /usr/share/common-licenses as bytes.\n"
              "The job flags are those of `adjsh submit`, with the same defaults; --spec runs a\n"
              "JobSpec in JSON instead.");
  a.Add("spec", "FILE.json", "the job as a JobSpec in JSON (excludes the job flags)");
  AddJobFlags(a);
  a.Add("trace", "FILE",
        "with --workers: append one JSON line per span task and step (bench/fleet_sim.py); steps "
        "of several sequences (a batch, documents reset) are not traced");
  a.Add("schedule", "spans|wavefront",
        "in-process: the span schedule (the bits --workers gives), or the wavefront over "
        "(layer, chunk), which runs each chunk's forward once and carries it to its backward "
        "(the fastest in-process; rounded differently; Mamba-1 only)",
        "spans");
  a.Add("cotangent", "exact|top-of-stack",
        "each layer's output cotangent: exact, or dL/du^{K+1} for every layer (the paper's "
        "Proposition 3, an approximation for K > 1; in-process only)",
        "exact");
  a.Add("loss-mask", "FILE",
        "with --tokens: one byte per corpus token, non-zero where the next-token target counts "
        "in the loss; steps then report the accuracy on the counted targets");
  a.Add("log-jsonl", "FILE",
        "append one JSON object per step (step, loss, grad_norm, lr, tokens_per_s, val_loss)");
  a.Add("threads", "N", "threads for in-process work (0: one per core)", "0");
  a.Add("spill-dir", "DIR",
        "keep the layer inputs in memory-mapped files here (the OS may write them to disk)");
  a.Add("workers", "N",
        "local worker processes owning the spans, on a private Unix socket (0: all "
        "in-process)",
        "0");
  a.Add("lease-ms", "MS",
        "with --workers: a task's lease; a lost worker's task is handed out again after it",
        "5000");
  AddReduceFlag(a, "with --workers: ");
  a.Add("metrics-listen", "HOST:PORT",
        "Prometheus metrics on http://HOST:PORT/metrics: steps, loss, tokens/s, gradient norm, "
        "learning rate, held-out loss, memory (with --workers also the tasks and wire)");
  a.Add("worker-metrics-listen", "HOST:PORT",
        "with --workers: worker i's metrics on HOST:(PORT+i) (PORT 0: a free one each)");
  AddWorkerDeviceFlag(a);
  a.Add("worker-log-dir", "DIR",
        "with --workers: worker i's log is appended to DIR/worker-<i>.log (the terminal shows "
        "the progress line; '-': the workers log to this terminal too) [default: "
        "CHECKPOINT_DIR/worker-logs]");
  a.AddBool("resume-newest-complete",
            "when --checkpoint-dir holds checkpoints but `latest` is missing, empty or names one "
            "that does not load: resume from the newest step folder that loads (said in the "
            "output) instead of stopping with the reason");
  AddDeviceFlags(a, "the tasks of an in-process run (with --workers, see --worker-device)");
  AddKeptFlag(a);
  AddDeviceMemFlag(a);
  if (auto code = ParseOrExit(a, args)) return *code;

  // What is trained: the job (one definition with `adjsh submit`, cli/job_flags.h).
  absl::StatusOr<v1::JobSpec> spec;
  if (a.Has("spec")) {
    if (AnyJobFlag(a)) {
      return BadUsage("train", absl::InvalidArgumentError(
                                   "--spec excludes the job flags (the spec defines the job)"));
    }
    spec = SpecFromFile(a.Get("spec"));
    if (!spec.ok()) return Fail("train", spec.status());
  } else {
    spec = SpecFromFlags(a);
    if (!spec.ok()) return BadUsage("train", spec.status());
  }
  if (spec->checkpoint_dir().empty()) spec->set_checkpoint_dir("adjsh-train");

  // How it runs here.
  int64_t threads = 0, workers = 0, lease_ms = 0;
  struct IntFlag {
    const char* name;
    int64_t min, max;
    int64_t* field;
  };
  // Local worker processes: at most grad's 1024 (100000 started a thousand processes before it
  // was stopped, without a word).
  for (const IntFlag& f : {IntFlag{"workers", 0, 1024, &workers},
                           IntFlag{"lease-ms", 100, int64_t{1} << 40, &lease_ms},
                           IntFlag{"threads", 0, int64_t{1} << 40, &threads}}) {
    absl::StatusOr<int64_t> v = a.GetInt(f.name, f.min, f.max);
    if (!v.ok()) return BadUsage("train", v.status());
    *f.field = *v;
  }
  absl::StatusOr<Device> device = DeviceFromFlags(a);
  if (!device.ok()) return BadUsage("train", device.status());
  absl::StatusOr<Cotangent> cotangent = CotangentFromName(a.Get("cotangent"));
  if (!cotangent.ok()) return BadUsage("train", cotangent.status());
  absl::StatusOr<Schedule> schedule = ScheduleFromName(a.Get("schedule"));
  if (!schedule.ok() || *schedule == Schedule::kTwoPass) {  // two-pass: grad's only
    return BadUsage("train", absl::InvalidArgumentError("--schedule must be spans or wavefront, "
                                                        "got '" + a.Get("schedule") + "'"));
  }
  {
    // What this model type can compute where (engine/capabilities.h), before anything runs.
    RunRequest request;
    request.runner = workers > 0 ? Runner::kWorkers : Runner::kInProcess;
    request.training = true;
    request.options.window = spec->window();
    request.options.cotangent = *cotangent;
    request.options.schedule = *schedule;
    request.options.device = *device;
    request.model = coordinator::JobModelType(*spec);
    if (absl::Status s = Supports(request); !s.ok()) return BadUsage("train", s);
  }
  for (const char* flag :
       {"worker-metrics-listen", "worker-device", "trace", "worker-log-dir", "reduce"}) {
    if (a.Given(flag) && workers == 0) {
      return BadUsage("train", absl::InvalidArgumentError(
                                   absl::StrCat("--", flag, " needs --workers N (N >= 1)")));
    }
  }
  for (const char* flag : {"metrics-listen", "worker-metrics-listen"}) {
    if (!a.Has(flag)) continue;
    if (absl::Status s = CheckHostPort(flag, a.Get(flag)); !s.ok()) {
      return BadUsage("train", s);
    }
  }
  absl::StatusOr<std::vector<std::string>> worker_devices = WorkerDevicesFromFlags(a);
  if (!worker_devices.ok()) return BadUsage("train", worker_devices.status());
  if (a.Has("loss-mask") && !spec->has_token_file()) {
    return BadUsage("train", absl::InvalidArgumentError("--loss-mask needs --tokens"));
  }

  // The job's checks, model, data and options, as a coordinator's runner takes them.
  if (absl::Status s = coordinator::ValidateJobSpec(
          *spec, coordinator::NoJobLimits(),
          workers == 0 ? coordinator::JobRunner::kInProcess
                       : coordinator::JobRunner::kLocalWorkers);
      !s.ok())
    return Fail("train", s);
  train::TrainOptions opt =
      coordinator::JobTrainOptions(*spec, static_cast<int>(threads), spec->checkpoint_dir());
  opt.grad.device = *device;
  opt.grad.device.bf16_storage = opt.grad.storage == Storage::kBF16 && !device->is_cpu();
  if (absl::Status s = CheckDeviceUsable(opt.grad.device); !s.ok()) return Fail("train", s);
  opt.grad.cotangent = *cotangent;
  opt.grad.schedule = *schedule;
  opt.grad.spill_dir = a.Get("spill-dir");
  if (a.GetBool("resume-newest-complete"))
    opt.resume_fallback = train::ResumeFallback::kNewestComplete;
  if (a.Has("loss-mask")) {
    absl::StatusOr<std::vector<uint8_t>> mask = LoadLossMask(a.Get("loss-mask"));
    if (!mask.ok()) return Fail("train", mask.status());
    opt.loss_mask = std::move(*mask);
  }
  if (spec->has_init()) {  // parameters, gradient and the two AdamW moments must fit
    absl::StatusOr<MambaConfig> config = coordinator::ConfigFromInit(spec->init());
    if (!config.ok()) return Fail("train", config.status());
    if (absl::Status s = CheckModelFitsInMemory(*config, 4); !s.ok()) return Fail("train", s);
  }
  return VisitFamily(coordinator::JobModelType(*spec), [&](auto family) {
    return TrainFamily<decltype(family)>(a, *spec, opt, workers, lease_ms,
                                         *std::move(worker_devices));
  });
}

}  // namespace adjsh::cli
