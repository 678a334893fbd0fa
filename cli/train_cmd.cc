// adjsh train: trains a Mamba LM on a corpus, one long sequence per step, with the exact
// adjoint-sharded gradient (or a truncated window), AdamW, checkpoints and resume.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device_flags.h"
#include "cli/model_flags.h"
#include "cli/train_report.h"
#include "common/metrics_server.h"
#include "common/model.h"
#include "common/token_data.h"
#include "common/tokens.h"
#include "coordinator/local_cluster.h"
#include "coordinator/metrics.h"
#include "train/dataset.h"
#include "train/trainer.h"

namespace adjsh::cli {
namespace {

// A loss mask file: raw bytes, one per corpus token; non-zero = the target there counts.
absl::StatusOr<std::vector<uint8_t>> LoadLossMask(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return absl::NotFoundError(absl::StrFormat("cannot open loss mask %s", path));
  std::vector<uint8_t> mask;
  uint8_t buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;)
    mask.insert(mask.end(), buf, buf + n);
  const bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrFormat("cannot read loss mask %s", path));
  return mask;
}

absl::StatusOr<TokenData> LoadCorpus(const ArgParser& a) {
  if (a.Has("tokens")) return TokenData::Map(a.Get("tokens"));
  std::vector<std::string> files;
  if (a.Has("text")) {
    files = absl::StrSplit(a.Get("text"), ',', absl::SkipEmpty());
  } else {
    files = BuiltinCorpusFiles();
    if (files.empty())
      return absl::NotFoundError("the built-in corpus /usr/share/common-licenses is empty");
  }
  absl::StatusOr<std::vector<uint32_t>> bytes = ReadTextAsBytes(files);
  if (!bytes.ok()) return bytes.status();
  return TokenData::FromIds(*std::move(bytes));
}

}  // namespace

int TrainCommand(const std::vector<std::string>& args) {
  ArgParser a("train",
              "Trains a Mamba LM on one long sequence per step (the next --context tokens of\n"
              "the corpus), with the exact gradient by adjoint sharding on local threads (or\n"
              "the truncated adjoint with --window), AdamW with warmup and cosine decay, and\n"
              "global gradient clipping. Checkpoints go to --checkpoint-dir; a run started\n"
              "again with the same directory resumes from its latest checkpoint. Without\n"
              "--model, a new byte-level model (vocabulary 256) is made from the shape flags;\n"
              "without --tokens/--text, the corpus is /usr/share/common-licenses as bytes.");
  a.Add("model", "DIR", "model to start from (default: a new model from the shape flags)");
  AddModelFlags(a, {"128", "4", "256"});
  a.Add("seed", "S", "seed of a new model", "0");
  a.Add("tokens", "FILE", "corpus as a token file (.u32/.u16)");
  a.Add("text", "FILE[,FILE...]", "corpus as text files, bytes as tokens");
  a.Add("context", "T", "tokens per sequence (the sequence length)", "16384");
  a.Add("batch-size", "B",
        "sequences per step: the loss is the mean over all their targets, the gradient the "
        "sum of theirs in sequence order",
        "1");
  a.Add("data-order", "sequential|shuffled",
        "the corpus's windows of --context tokens: in file order, or in a seeded shuffled "
        "order per epoch (resumable)",
        "shuffled");
  a.Add("data-seed", "S", "the shuffle's seed", "0");
  a.Add("steps", "S", "optimizer steps", "60");
  a.Add("chunk", "C", "tokens per chunk (one kernel call)", "256");
  a.Add("spans", "S",
        "spans per step, each owned by one worker or thread (default: about T/16384, at least "
        "8, at most one per chunk); the result depends on S, never on threads or workers",
        "0");
  a.Add("trace", "FILE",
        "with --workers: append one JSON line per span task and step (bench/fleet_sim.py)");
  a.Add("window", "Wt", "truncated adjoint window (default: exact gradient)");
  a.Add("cotangent", "exact|top-of-stack",
        "each layer's output cotangent: exact, or dL/du^{K+1} for every layer (the paper's "
        "Proposition 3, an approximation for K > 1; in-process only)",
        "exact");
  a.Add("loss-mask", "FILE",
        "with --tokens: one byte per corpus token, non-zero where the next-token target counts "
        "in the loss; steps then report the accuracy on the counted targets");
  a.Add("data", "PREFIX.json",
        "corpus prepared by adjsh prepare (its manifest): the train split, and its held-out "
        "split as --val-data; its tokenizer must fit the model's vocabulary");
  a.Add("val-data", "FILE",
        "held-out token file (.u32/.u16) for --eval-every: its loss and perplexity in the "
        "progress line and the log");
  a.Add("eval-every", "N", "with held-out data: evaluate every N steps and after the last "
        "(0: never) [default: 10]");
  a.Add("eval-tokens", "M",
        "with --val-data: the first M tokens of it, in sequences of --context (0: all) "
        "[default: 0]");
  a.Add("log-jsonl", "FILE",
        "append one JSON object per step (step, loss, grad_norm, lr, tokens_per_s, val_loss)");
  a.Add("threads", "N", "threads for in-process work (0: one per core)", "0");
  a.Add("spill-dir", "DIR",
        "keep the layer inputs in memory-mapped files here (the OS may write them to disk)");
  a.Add("storage", "full|bf16",
        "the layer inputs and chunk states kept for the backward: in f32, or rounded to bf16 "
        "(half the bytes)",
        "full");
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
  a.Add("lr", "LR", "peak learning rate", "3e-3");
  a.Add("warmup", "S", "linear warmup steps", "10");
  a.Add("min-lr-ratio", "R", "final learning rate as a fraction of the peak (cosine)", "0.1");
  a.Add("weight-decay", "WD", "AdamW decoupled weight decay", "0.1");
  a.Add("beta2", "B2", "AdamW beta2", "0.95");
  a.Add("grad-clip", "G", "global gradient-norm clip (0: off)", "1.0");
  a.Add("checkpoint-dir", "DIR", "checkpoints (and resume) directory", "adjsh-train");
  a.Add("checkpoint-every", "S", "steps between checkpoints (0: only at the end)", "20");
  a.Add("resume", "auto|never|must",
        "auto: from the latest checkpoint in --checkpoint-dir if there is one; never: a fresh "
        "start (refused if the directory holds checkpoints); must: refused without one. A "
        "resume with a different model, data, context, batch, order or schedule is refused",
        "auto");
  a.Add("keep-checkpoints", "N", "the newest step folders of this run that are kept", "2");
  a.Add("save-dtype", "f32|bf16",
        "of each checkpoint's model.safetensors (bf16: half the bytes; a resume then starts "
        "from the rounded weights)",
        "f32");
  a.AddBool("resume-newest-complete",
            "when --checkpoint-dir holds checkpoints but `latest` is missing, empty or names one "
            "that does not load: resume from the newest step folder that loads (said in the "
            "output) instead of stopping with the reason");
  AddDeviceFlags(a, "the forward, head and (without --workers) backward tasks");
  if (auto code = ParseOrExit(a, args)) return *code;
  if (a.Has("tokens") && a.Has("text")) {
    return BadUsage("train", absl::InvalidArgumentError("give --tokens or --text, not both"));
  }

  train::TrainOptions opt;
  struct IntFlag {
    const char* name;
    int64_t min;
    int64_t* field;
  };
  int64_t threads = 0, workers = 0, lease_ms = 0;
  for (const IntFlag& f : {IntFlag{"context", 2, &opt.context}, IntFlag{"steps", 1, &opt.steps},
                           IntFlag{"workers", 0, &workers}, IntFlag{"lease-ms", 100, &lease_ms},
                           IntFlag{"chunk", 1, &opt.grad.chunk},
                           IntFlag{"spans", 0, &opt.grad.spans},
                           IntFlag{"threads", 0, &threads},
                           IntFlag{"warmup", 0, &opt.adamw.warmup_steps},
                           IntFlag{"checkpoint-every", 0, &opt.checkpoint_every},
                           IntFlag{"batch-size", 1, &opt.batch_size}}) {
    absl::StatusOr<int64_t> v = a.GetInt(f.name, f.min, int64_t{1} << 40);
    if (!v.ok()) return BadUsage("train", v.status());
    *f.field = *v;
  }
  opt.grad.threads = static_cast<int>(threads);
  absl::StatusOr<train::DataOrder> order = train::DataOrderFromName(a.Get("data-order"));
  if (!order.ok()) return BadUsage("train", order.status());
  opt.order = *order;
  absl::StatusOr<int64_t> data_seed = a.GetInt("data-seed", 0, INT64_MAX);
  if (!data_seed.ok()) return BadUsage("train", data_seed.status());
  opt.data_seed = static_cast<uint64_t>(*data_seed);
  absl::StatusOr<train::ResumeMode> resume = train::ResumeModeFromName(a.Get("resume"));
  if (!resume.ok()) return BadUsage("train", resume.status());
  opt.resume = *resume;
  absl::StatusOr<int64_t> keep = a.GetInt("keep-checkpoints", 1, 1 << 20);
  if (!keep.ok()) return BadUsage("train", keep.status());
  opt.keep_checkpoints = static_cast<int>(*keep);
  const std::string save_dtype = a.Get("save-dtype");
  if (save_dtype != "f32" && save_dtype != "bf16") {
    return BadUsage("train", absl::InvalidArgumentError(
                                 "--save-dtype must be f32 or bf16, got '" + save_dtype + "'"));
  }
  opt.save_dtype = save_dtype == "bf16" ? DType::kBF16 : DType::kF32;
  if (a.Has("model")) opt.source_model_dir = a.Get("model");
  for (const char* flag : {"eval-every", "eval-tokens"}) {
    if (a.Has(flag) && !a.Has("val-data") && !a.Has("data")) {
      return BadUsage("train", absl::InvalidArgumentError(absl::StrCat(
                                   "--", flag, " needs held-out data (--val-data or --data)")));
    }
  }
  int given = 0;
  for (const char* flag : {"data", "tokens", "text"}) given += a.Has(flag) ? 1 : 0;
  if (given > 1) {
    return BadUsage("train",
                    absl::InvalidArgumentError("give one of --data, --tokens and --text"));
  }
  if (a.Has("val-data") || a.Has("data")) {
    absl::StatusOr<int64_t> every =
        a.Has("eval-every") ? a.GetInt("eval-every", 0, int64_t{1} << 40) : 10;
    if (!every.ok()) return BadUsage("train", every.status());
    opt.eval_every = *every;
    absl::StatusOr<int64_t> eval_tokens =
        a.Has("eval-tokens") ? a.GetInt("eval-tokens", 0, int64_t{1} << 40) : 0;
    if (!eval_tokens.ok()) return BadUsage("train", eval_tokens.status());
    opt.eval_tokens = *eval_tokens;
  }
  if (a.GetBool("resume-newest-complete"))
    opt.resume_fallback = train::ResumeFallback::kNewestComplete;
  absl::StatusOr<Device> device = DeviceFromFlags(a);
  if (!device.ok()) return BadUsage("train", device.status());
  opt.grad.device = *device;
  opt.grad.spill_dir = a.Get("spill-dir");
  absl::StatusOr<Storage> storage = StorageFromFlags(a);
  if (!storage.ok()) return BadUsage("train", storage.status());
  opt.grad.storage = *storage;  // on a GPU also its activations and weights
  opt.grad.device.bf16_storage = opt.grad.storage == Storage::kBF16 && !opt.grad.device.is_cpu();
  if (absl::Status s = CheckDeviceUsable(opt.grad.device); !s.ok()) return Fail("train", s);
  if (a.Has("window")) {
    absl::StatusOr<int64_t> w = a.GetInt("window", 1, int64_t{1} << 40);
    if (!w.ok()) return BadUsage("train", w.status());
    opt.grad.window = *w;
  }
  absl::StatusOr<Cotangent> cotangent = CotangentFromName(a.Get("cotangent"));
  if (!cotangent.ok()) return BadUsage("train", cotangent.status());
  opt.grad.cotangent = *cotangent;
  if (a.Has("loss-mask")) {
    if (!a.Has("tokens")) {
      return BadUsage("train", absl::InvalidArgumentError("--loss-mask needs --tokens"));
    }
    absl::StatusOr<std::vector<uint8_t>> mask = LoadLossMask(a.Get("loss-mask"));
    if (!mask.ok()) return Fail("train", mask.status());
    opt.loss_mask = std::move(*mask);
  }
  struct RealFlag {
    const char* name;
    double* field;
  };
  for (const RealFlag& f : {RealFlag{"lr", &opt.adamw.lr},
                            RealFlag{"min-lr-ratio", &opt.adamw.min_lr_ratio},
                            RealFlag{"weight-decay", &opt.adamw.weight_decay},
                            RealFlag{"beta2", &opt.adamw.beta2},
                            RealFlag{"grad-clip", &opt.adamw.grad_clip}}) {
    absl::StatusOr<double> v = a.GetDouble(f.name);
    if (!v.ok()) return BadUsage("train", v.status());
    *f.field = *v;
  }
  opt.checkpoint_dir = a.Get("checkpoint-dir");
  for (const char* flag : {"worker-metrics-listen", "worker-device", "trace", "worker-log-dir"}) {
    if (a.Has(flag) && workers == 0) {
      return BadUsage("train", absl::InvalidArgumentError(
                                   absl::StrCat("--", flag, " needs --workers N (N >= 1)")));
    }
  }
  for (const char* flag : {"metrics-listen", "worker-metrics-listen"}) {
    if (!a.Has(flag)) continue;
    if (absl::Status s = metrics::CheckListenAddress(flag, a.Get(flag)); !s.ok()) {
      return BadUsage("train", s);
    }
  }
  absl::StatusOr<std::vector<std::string>> worker_devices = WorkerDevicesFromFlags(a);
  if (!worker_devices.ok()) return BadUsage("train", worker_devices.status());

  ModelParams<float> params;
  if (a.Has("model")) {
    absl::StatusOr<ModelParams<float>> p = LoadModelDir<float>(a.Get("model"));
    if (!p.ok()) return Fail("train", p.status());
    params = std::move(*p);
  } else {
    absl::StatusOr<MambaConfig> config = ConfigFromFlags(a);
    if (!config.ok()) return BadUsage("train", config.status());
    absl::StatusOr<int64_t> seed = a.GetInt("seed", 0, INT64_MAX);
    if (!seed.ok()) return BadUsage("train", seed.status());
    // Parameters, gradient and the two AdamW moments.
    if (absl::Status s = CheckModelFitsInMemory(*config, 4); !s.ok()) return Fail("train", s);
    params = InitParams<float>(*config, *seed);
  }
  std::optional<TokenData> val;
  absl::StatusOr<TokenData> corpus = absl::UnknownError("no corpus");
  if (a.Has("data")) {
    absl::StatusOr<train::PreparedData> data = train::LoadPrepared(a.Get("data"));
    if (!data.ok()) return Fail("train", data.status());
    if (absl::Status s = train::CheckVocabulary(*data, params.config.vocab_size); !s.ok())
      return Fail("train", s);
    corpus = std::move(data->train.tokens);
    if (data->val) val = std::move(data->val->tokens);
    if (!data->val && !a.Has("val-data")) opt.eval_every = 0;  // nothing held out
  } else {
    corpus = LoadCorpus(a);
    if (!corpus.ok()) return Fail("train", corpus.status());
  }
  if (a.Has("val-data")) {
    absl::StatusOr<TokenData> mapped = TokenData::Map(a.Get("val-data"));
    if (!mapped.ok()) return Fail("train", mapped.status());
    val = *std::move(mapped);
  }

  const MambaConfig& c = params.config;
  train::Trainer trainer(std::move(params), std::move(*corpus), opt);
  if (val) trainer.set_validation(*std::move(val));
  if (absl::Status s = trainer.Init(); !s.ok()) return Fail("train", s);
  std::unique_ptr<coordinator::LocalCluster> cluster;
  std::shared_ptr<coordinator::CoordinatorMetrics> cluster_metrics;
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  int64_t first_step = 0;
  if (workers > 0) {
    if (opt.grad.window != 0 || opt.grad.cotangent != Cotangent::kExact) {
      return BadUsage("train", absl::InvalidArgumentError(
                                   "--workers runs the exact gradient by the span schedule only "
                                   "(no --window or --cotangent top-of-stack: those run "
                                   "in-process)"));
    }
    if (!opt.grad.device.is_cpu()) {
      return BadUsage("train", absl::InvalidArgumentError(
                                   "with --workers the coordinator computes nothing: give the "
                                   "device to the workers with --worker-device"));
    }
    coordinator::LocalClusterOptions cluster_options;
    cluster_options.service.lease = absl::Milliseconds(lease_ms);
    cluster_options.service.trace_path = a.Get("trace");
    absl::StatusOr<bool> tree = ReduceFromFlags(a);
    if (!tree.ok()) return BadUsage("train", tree.status());
    cluster_options.service.worker_tree = *tree;
    cluster_options.worker_metrics = a.Get("worker-metrics-listen");
    cluster_options.worker_devices = *std::move(worker_devices);
    const std::string log_dir =
        a.Has("worker-log-dir") ? a.Get("worker-log-dir") : opt.checkpoint_dir + "/worker-logs";
    if (log_dir != "-") cluster_options.log_dir = log_dir;
    absl::StatusOr<std::unique_ptr<coordinator::LocalCluster>> started =
        coordinator::LocalCluster::Start(static_cast<int>(workers), SelfExe(),
                                         std::move(cluster_options));
    if (!started.ok()) return Fail("train", started.status());
    cluster = std::move(*started);
    std::fprintf(stderr, "coordinator on %s with %lld worker processes\n",
                 cluster->address().c_str(), static_cast<long long>(workers));
    int64_t step = trainer.state().step;
    first_step = step;
    trainer.set_gradient_source([&](const ModelParams<float>& p, std::span<const uint32_t> t,
                                    const GradOptions& options) {
      return cluster->service().ComputeGradient(p, t, options, "train", step++);
    });
  }
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
               "model D=%lld K=%lld N=%lld V=%lld | context %lld tokens x batch %lld, %s | %s "
               "gradient, chunk %lld | %lld steps%s\n",
               static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_hidden_layers),
               static_cast<long long>(c.state_size), static_cast<long long>(c.vocab_size),
               static_cast<long long>(opt.context), static_cast<long long>(opt.batch_size),
               std::string(train::DataOrderName(opt.order)).c_str(),
               (std::string(opt.grad.window > 0
                                    ? absl::StrFormat("window-%d", opt.grad.window)
                                    : "exact") +
                (opt.grad.cotangent == Cotangent::kTopOfStack ? " top-of-stack" : ""))
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
  if (cluster_metrics) cluster_metrics->JobStarted("train", trainer.state().step, opt.steps);
  const absl::Status trained = trainer.Run([&](const train::StepReport& r) {
    if (cluster_metrics) cluster_metrics->StepDone("train", r, opt.context);
    PrintProgress(r);
    if (log) log->Write(r);
  });
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

}  // namespace adjsh::cli
