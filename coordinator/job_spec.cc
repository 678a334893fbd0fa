#include "coordinator/job_spec.h"

#include "train/dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/config.h"
#include "common/file_io.h"
#include "common/mamba2_config.h"
#include "common/saturating.h"
#include "common/strings.h"
#include "common/tokens.h"
#include "engine/capabilities.h"
#include "engine/adjoint_engine.h"
#include "common/mamba2_model.h"
#include "engine/span_plan.h"

namespace adjsh::coordinator {
namespace fs = std::filesystem;
namespace {

constexpr int64_t kDefaultChunk = 256;  // as adjsh train's --chunk

absl::Status Invalid(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

// The config of an InitConfig, defaults filled in as `adjsh train` / `adjsh init` do.

// A file that must exist on the coordinator: NOT_FOUND naming the field otherwise.
absl::Status CheckFile(const std::string& field, const std::string& path) {
  if (path.empty()) return Invalid(field, "is empty");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    return absl::NotFoundError(absl::StrCat(field, ": ", path, " does not exist"));
  }
  if (fs::is_directory(st)) return Invalid(field, absl::StrCat(path, " is a directory"));
  if (!fs::is_regular_file(st)) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": ", path, " is not a regular file (a FIFO, device or socket is never read)"));
  }
  return absl::OkStatus();
}

// CheckFile, and its size added to *total (saturating).
absl::Status CheckDataFile(const std::string& field, const std::string& path, uint64_t* total) {
  if (absl::Status s = CheckFile(field, path); !s.ok()) return s;
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(field, ": cannot stat ", path));
  *total = SatAdd(*total, size);
  return absl::OkStatus();
}

absl::Status CheckOptimizer(const v1::AdamW& o) {
  auto real = [](const char* name, bool has, double v, bool ok, const char* want) {
    if (!has || (std::isfinite(v) && ok)) return absl::OkStatus();
    return Invalid(absl::StrCat("optimizer.", name), absl::StrCat("must be ", want, ", got ", v));
  };
  for (absl::Status s :
       {real("lr", o.has_lr(), o.lr(), o.lr() > 0, "> 0"),
        real("beta1", o.has_beta1(), o.beta1(), o.beta1() >= 0 && o.beta1() < 1, "in [0, 1)"),
        real("beta2", o.has_beta2(), o.beta2(), o.beta2() >= 0 && o.beta2() < 1, "in [0, 1)"),
        real("eps", o.has_eps(), o.eps(), o.eps() > 0, "> 0"),
        real("weight_decay", o.has_weight_decay(), o.weight_decay(), o.weight_decay() >= 0, ">= 0"),
        real("min_lr_ratio", o.has_min_lr_ratio(), o.min_lr_ratio(),
             o.min_lr_ratio() >= 0 && o.min_lr_ratio() <= 1, "in [0, 1]"),
        real("grad_clip", o.has_grad_clip(), o.grad_clip(), o.grad_clip() >= 0, ">= 0")}) {
    if (!s.ok()) return s;
  }
  if (o.has_warmup_steps() && o.warmup_steps() < 0) {
    return Invalid("optimizer.warmup_steps", absl::StrCat("must be >= 0, got ", o.warmup_steps()));
  }
  return absl::OkStatus();
}

train::AdamWOptions AdamWFromSpec(const v1::AdamW& o) {
  train::AdamWOptions a;  // unset fields: train/optimizer.h's defaults
  if (o.has_lr()) a.lr = o.lr();
  if (o.has_beta1()) a.beta1 = o.beta1();
  if (o.has_beta2()) a.beta2 = o.beta2();
  if (o.has_eps()) a.eps = o.eps();
  if (o.has_weight_decay()) a.weight_decay = o.weight_decay();
  if (o.has_warmup_steps()) a.warmup_steps = o.warmup_steps();
  if (o.has_min_lr_ratio()) a.min_lr_ratio = o.min_lr_ratio();
  if (o.has_grad_clip()) a.grad_clip = o.grad_clip();
  return a;
}

absl::Status OverLimit(const std::string& what, const std::string& flag, uint64_t value,
                       uint64_t limit) {
  return absl::InvalidArgumentError(absl::StrCat(what, " ", value,
                                                 " exceeds the coordinator's limit ", flag, " ",
                                                 limit));
}

uint64_t ModelBytesF32(const MambaConfig& c) { return ParamBytesF32(c); }
uint64_t ModelBytesF32(const Mamba2Config& c) { return Mamba2ParamBytesF32(c); }

// The job limits on a model of either type (the coordinator holds its parameters, gradient
// and two AdamW moments).
template <typename Config>
absl::Status CheckModelLimits(const Config& c, const std::string& field,
                              const JobLimits& limits) {
  if (c.num_hidden_layers > limits.max_layers) {
    return OverLimit(absl::StrCat(field, ": layers (K)"), "--max-layers",
                     static_cast<uint64_t>(c.num_hidden_layers),
                     static_cast<uint64_t>(limits.max_layers));
  }
  if (c.hidden_size > limits.max_hidden) {
    return OverLimit(absl::StrCat(field, ": hidden size (D)"), "--max-hidden",
                     static_cast<uint64_t>(c.hidden_size),
                     static_cast<uint64_t>(limits.max_hidden));
  }
  const uint64_t bytes = LargestParamBytes(c);
  if (bytes > limits.max_tensor_bytes) {
    return OverLimit(absl::StrCat(field, ": largest parameter tensor in bytes"),
                     "--max-tensor-bytes", bytes, limits.max_tensor_bytes);
  }
  const uint64_t model = ModelBytesF32(c);
  if (model > limits.max_model_bytes) {
    return OverLimit(absl::StrCat(field, ": the model's parameters in f32 bytes"),
                     "--max-model-bytes", model, limits.max_model_bytes);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MambaConfig> ConfigFromInit(const v1::InitConfig& init) {
  struct Field {
    const char* name;
    int64_t value, min;
  };
  for (const Field& f :
       {Field{"init.hidden_size", init.hidden_size(), 1}, Field{"init.layers", init.layers(), 1},
        Field{"init.vocab_size", init.vocab_size(), 1},
        Field{"init.state_size", init.state_size(), 0},
        Field{"init.conv_kernel", init.conv_kernel(), 0}, Field{"init.expand", init.expand(), 0},
        Field{"init.dt_rank", init.dt_rank(), 0}}) {
    if (f.value < f.min || f.value > (int64_t{1} << 31)) {
      return Invalid(f.name, absl::StrFormat("must be in [%d, 2^31], got %d", f.min, f.value));
    }
  }
  MambaConfig c;
  c.hidden_size = init.hidden_size();
  c.num_hidden_layers = init.layers();
  c.vocab_size = init.vocab_size();
  if (init.state_size() > 0) c.state_size = init.state_size();
  if (init.conv_kernel() > 0) c.conv_kernel = init.conv_kernel();
  if (init.expand() > 0) c.expand = init.expand();
  c.time_step_rank = init.dt_rank() > 0 ? init.dt_rank() : (c.hidden_size + 15) / 16;
  if (init.layer_norm_epsilon() != 0) c.layer_norm_epsilon = init.layer_norm_epsilon();
  c.tie_word_embeddings = !init.untied_head();
  if (absl::Status s = ValidateConfig(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("init: ", s.message()));
  }
  return c;
}

uint64_t LargestParamBytes(const MambaConfig& c) {
  const auto u = [](int64_t v) { return static_cast<uint64_t>(std::max<int64_t>(v, 0)); };
  const uint64_t d = u(c.hidden_size), di = SatMul(u(c.expand), d);
  uint64_t largest = 0;
  for (uint64_t n : {SatMul(u(c.vocab_size), d),                   // embeddings (V, D)
                     SatMul(SatMul(2, di), d),                     // in_proj (2 Di, D)
                     SatMul(u(c.time_step_rank) + SatMul(2, u(c.state_size)), di),  // x_proj
                     SatMul(di, u(c.time_step_rank)),              // dt_proj (Di, R)
                     SatMul(di, u(c.state_size)),                  // A_log (Di, N)
                     SatMul(di, u(c.conv_kernel))}) {              // conv1d (Di, 1, W)
    largest = std::max(largest, n);
  }
  return SatMul(largest, sizeof(float));
}

uint64_t LargestParamBytes(const Mamba2Config& c) {
  const auto u = [](int64_t v) { return static_cast<uint64_t>(std::max<int64_t>(v, 0)); };
  const uint64_t d = u(c.hidden_size);
  uint64_t largest = 0;
  for (uint64_t n : {SatMul(u(c.vocab_size), d),                  // embeddings (V, D)
                     SatMul(u(c.in_proj_rows()), d),              // in_proj (Dp, D)
                     SatMul(d, u(c.inner())),                     // out_proj (D, Di)
                     SatMul(u(c.conv_channels()), u(c.conv_kernel))}) {  // conv1d (Cc, 1, W)
    largest = std::max(largest, n);
  }
  return SatMul(largest, sizeof(float));
}

absl::Status CheckSpecRequestSize(const v1::JobSpec& spec) {
  // Sizes of the request itself: a spec is kept for the job's lifetime and sent back in every
  // status reply, and its strings may be echoed in errors.
  if (spec.ByteSizeLong() > kMaxSpecBytes) {
    return Invalid("spec", absl::StrCat(spec.ByteSizeLong(), " bytes, over the limit of ",
                                        kMaxSpecBytes));
  }
  if (spec.text_files().paths_size() > kMaxTextFiles) {
    return Invalid("text_files.paths", absl::StrCat(spec.text_files().paths_size(),
                                                    " files, over the limit of ", kMaxTextFiles));
  }
  std::vector<std::pair<std::string, const std::string*>> paths = {
      {"model_dir", &spec.model_dir()}, {"token_file", &spec.token_file()},
      {"checkpoint_dir", &spec.checkpoint_dir()}};
  for (int i = 0; i < spec.text_files().paths_size(); ++i)
    paths.emplace_back(absl::StrCat("text_files.paths[", i, "]"), &spec.text_files().paths(i));
  for (const auto& [field, path] : paths) {
    if (path->size() > kMaxPathBytes) {
      return Invalid(field, absl::StrCat("a path of ", path->size(),
                                         " bytes, over the limit of ", kMaxPathBytes));
    }
  }

  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec, const JobLimits& limits,
                             JobRunner runner) {
  const bool in_process = runner == JobRunner::kInProcess;
  if (absl::Status s = CheckSpecRequestSize(spec); !s.ok()) return s;

  // The model.
  int64_t vocab = 0;
  int64_t conv_width = 0;  // W, for the span plan's check below
  switch (spec.model_case()) {
    case v1::JobSpec::kModelDir: {
      const std::string& dir = spec.model_dir();
      if (dir.empty()) return Invalid("model_dir", "is empty");
      std::error_code ec;
      if (!fs::exists(dir, ec)) {
        return absl::NotFoundError(absl::StrCat("model_dir: ", dir, " does not exist"));
      }
      if (!fs::is_directory(dir, ec))
        return Invalid("model_dir", absl::StrCat(dir, " is not a directory"));
      for (const char* file : {"config.json", "model.safetensors"}) {
        if (!fs::exists(fs::path(dir) / file, ec)) {
          return absl::NotFoundError(absl::StrCat("model_dir: ", dir, " has no ", file));
        }
        if (absl::Status s = CheckFile("model_dir", (fs::path(dir) / file).string()); !s.ok())
          return s;
      }
      const std::string config_path = (fs::path(dir) / "config.json").string();
      absl::StatusOr<std::string> text = ReadFileToString(config_path);
      if (!text.ok()) {
        return absl::Status(text.status().code(),
                            absl::StrCat("model_dir: ", text.status().message()));
      }
      if (ModelTypeOf(*text).value_or("") == "mamba2") {
        absl::StatusOr<Mamba2Config> m2 = ParseMamba2ConfigJson(*text);  // Mamba-2
        if (!m2.ok()) {
          return absl::Status(m2.status().code(), absl::StrCat("model_dir: ", config_path, ": ",
                                                                m2.status().message()));
        }
        if (absl::Status s = CheckModelLimits(*m2, "model_dir", limits); !s.ok()) return s;
        vocab = m2->vocab_size;
        conv_width = m2->conv_kernel;
        break;
      }
      absl::StatusOr<MambaConfig> c = ParseConfigJson(*text);  // LoadConfigFile's, read once
      if (!c.ok()) {
        return absl::Status(c.status().code(), absl::StrCat("model_dir: ", config_path, ": ",
                                                            c.status().message()));
      }
      if (absl::Status s = CheckModelLimits(*c, "model_dir", limits); !s.ok()) return s;
      vocab = c->vocab_size;
      conv_width = c->conv_kernel;
      break;
    }
    case v1::JobSpec::kInit: {
      absl::StatusOr<MambaConfig> c = ConfigFromInit(spec.init());
      if (!c.ok()) return c.status();
      if (absl::Status s = CheckModelLimits(*c, "init", limits); !s.ok()) return s;
      vocab = c->vocab_size;
      conv_width = c->conv_kernel;
      break;
    }
    default:
      return Invalid("model", "the spec has no model: give model_dir or init");
  }

  // Sizes and modes.
  if (spec.context_length() < 2) {
    return Invalid("context_length",
                   absl::StrCat("must be >= 2 tokens, got ", spec.context_length()));
  }
  if (spec.context_length() > limits.max_context) {
    return OverLimit("context_length (T)", "--max-context",
                     static_cast<uint64_t>(spec.context_length()),
                     static_cast<uint64_t>(limits.max_context));
  }
  if (spec.steps() < 1) return Invalid("steps", absl::StrCat("must be >= 1, got ", spec.steps()));
  if (spec.chunk() < 0) {
    return Invalid("chunk",
                   absl::StrCat("must be >= 1 (or 0 for the default 256), got ", spec.chunk()));
  }
  if (spec.spans() < 0) {
    return Invalid("spans", absl::StrCat("must be >= 1 (or 0 for the default), got ",
                                         spec.spans()));
  }
  // A coordinator's job runs the span plan of the exact gradient: spans its chunks cannot hold
  // are refused now, not when the job starts. In process (adjsh train) the plan may not be
  // used at all (--window, --schedule), and the engine checks it before the first step.
  if (spec.spans() > 0 && !in_process) {
    const int64_t chunk = spec.chunk() > 0 ? spec.chunk() : kDefaultChunk;
    const absl::Status fit =
        SpanPlan::CheckSpans(spec.context_length(), chunk, spec.spans(), conv_width);
    // The plan's messages name adjsh train's flag ("--spans N: ..."); a spec has the field.
    if (!fit.ok()) return absl::InvalidArgumentError(absl::StripPrefix(fit.message(), "--"));
  }
  if (spec.window() < 0)
    return Invalid("window", absl::StrCat("must be >= 0, got ", spec.window()));
  if (!in_process) {
    // What workers compute (engine/capabilities.h): a truncated window runs in-process only.
    RunRequest request;  // (f64 is refused for every job below)
    request.runner = Runner::kWorkers;
    request.options.window = spec.window();
    request.model = JobModelType(spec);
    if (absl::Status s = Supports(request, Naming::kSpecField); !s.ok()) return s;
  }
  if (spec.dtype() == "f64") {  // a job trains in f32 wherever it runs (f64 is adjsh grad's)
    return absl::UnimplementedError(
        "dtype: f64 is not supported for training jobs (f32 only); use \"f32\" or leave it empty");
  }
  if (!spec.dtype().empty() && spec.dtype() != "f32") {
    return Invalid("dtype",
                   absl::StrCat("must be \"f32\" (or empty), got \"", Echo(spec.dtype()), "\""));
  }
  if (!spec.storage().empty() && !ParseStorage(spec.storage()).ok()) {
    return Invalid("storage", absl::StrCat("must be \"full\" or \"bf16\" (or empty), got \"",
                                           Echo(spec.storage()), "\""));
  }
  if (spec.checkpoint_every() < 0) {
    return Invalid("checkpoint_every", absl::StrCat("must be >= 0, got ", spec.checkpoint_every()));
  }
  if (absl::Status s = CheckOptimizer(spec.optimizer()); !s.ok()) return s;
  struct NonNegative {
    const char* field;
    int64_t value;
  };
  for (const NonNegative& f : {NonNegative{"batch_size", spec.batch_size()},
                               NonNegative{"eval_every", spec.eval_every()},
                               NonNegative{"eval_tokens", spec.eval_tokens()},
                               NonNegative{"keep_checkpoints", spec.keep_checkpoints()},
                               NonNegative{"expected_workers", spec.expected_workers()}}) {
    if (f.value < 0) return Invalid(f.field, absl::StrCat("must be >= 0, got ", f.value));
  }
  // A step's tokens, context_length x batch_size, are what --max-context bounds: the trainer
  // copies them all (train/trainer.cc BatchGradient). Divided, not multiplied: no overflow.
  if (spec.batch_size() > 1 && spec.batch_size() > limits.max_context / spec.context_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context_length x batch_size (", spec.context_length(), " x ", spec.batch_size(),
        " tokens per step) exceeds the coordinator's limit --max-context ", limits.max_context));
  }
  if (spec.keep_checkpoints() > kMaxKeepCheckpoints) {
    return Invalid("keep_checkpoints", absl::StrCat("must be at most ", kMaxKeepCheckpoints,
                                                    ", got ", spec.keep_checkpoints()));
  }
  if (!spec.data_order().empty() && !train::DataOrderFromName(spec.data_order()).ok()) {
    return Invalid("data_order", absl::StrCat("must be \"shuffled\" or \"sequential\" (or "
                                              "empty), got \"", Echo(spec.data_order()), "\""));
  }
  if (!spec.resume().empty() && !train::ResumeModeFromName(spec.resume()).ok()) {
    return Invalid("resume", absl::StrCat("must be \"auto\", \"never\" or \"must\" (or empty), "
                                          "got \"", Echo(spec.resume()), "\""));
  }
  if (!spec.doc_boundaries().empty() && spec.doc_boundaries() != "cross" &&
      spec.doc_boundaries() != "reset") {
    return Invalid("doc_boundaries", absl::StrCat("must be \"cross\" or \"reset\" (or empty), "
                                                  "got \"", Echo(spec.doc_boundaries()), "\""));
  }
  if (spec.doc_boundaries() == "reset" && spec.data_case() != v1::JobSpec::kPreparedData) {
    return Invalid("doc_boundaries",
                   "\"reset\" needs the document index of prepared_data (adjsh prepare)");
  }
  if (!spec.save_dtype().empty() && spec.save_dtype() != "f32" && spec.save_dtype() != "bf16") {
    return Invalid("save_dtype", absl::StrCat("must be \"f32\" or \"bf16\" (or empty), got \"",
                                              Echo(spec.save_dtype()), "\""));
  }

  // The data.
  uint64_t data_bytes = 0;
  switch (spec.data_case()) {
    case v1::JobSpec::kTokenFile: {
      const std::string& path = spec.token_file();
      if (path.empty()) return Invalid("token_file", "is empty");
      if (!absl::EndsWith(path, ".u32") && !absl::EndsWith(path, ".u16")) {
        return Invalid("token_file", absl::StrCat(path, " is not a .u32 or .u16 token file"));
      }
      if (absl::Status s = CheckDataFile("token_file", path, &data_bytes); !s.ok()) return s;
      break;
    }
    case v1::JobSpec::kTextFiles: {
      if (spec.text_files().paths().empty()) return Invalid("text_files.paths", "is empty");
      for (int i = 0; i < spec.text_files().paths_size(); ++i) {
        if (absl::Status s = CheckDataFile(absl::StrCat("text_files.paths[", i, "]"),
                                           spec.text_files().paths(i), &data_bytes);
            !s.ok())
          return s;
      }
      break;
    }
    case v1::JobSpec::kPreparedData: {
      if (spec.prepared_data().empty()) return Invalid("prepared_data", "is empty");
      if (absl::Status s = CheckFile("prepared_data", spec.prepared_data()); !s.ok()) return s;
      absl::StatusOr<train::PreparedData> data = train::LoadPrepared(spec.prepared_data());
      if (!data.ok()) {
        return absl::Status(data.status().code(),
                            absl::StrCat("prepared_data: ", data.status().message()));
      }
      if (absl::Status s = train::CheckVocabulary(*data, vocab); !s.ok()) return s;
      if (!data->val && spec.eval_every() > 0 && spec.val_token_file().empty()) {
        // (adjsh submit turns evaluation off by default for such data when it can read the
        // manifest; a coordinator that reads another one says so here, not when the job runs.)
        return Invalid("eval_every", absl::StrCat("needs held-out data: ", spec.prepared_data(),
                                                  " has no held-out split (prepared with "
                                                  "--val-fraction 0); give val_token_file, or "
                                                  "eval_every 0"));
      }
      data_bytes += static_cast<uint64_t>(data->train.tokens.size()) *
                    (data->vocab_size > 65536 ? 4 : 2);
      break;
    }
    default:
      if (BuiltinCorpusFiles().empty()) {
        return absl::FailedPreconditionError(
            "data: the spec has no data and the built-in corpus (/usr/share/common-licenses) is "
            "empty on the coordinator; give token_file or text_files");
      }
      for (const std::string& path : BuiltinCorpusFiles())
        if (absl::Status s = CheckDataFile("the built-in corpus", path, &data_bytes); !s.ok())
          return s;
  }
  if (data_bytes > limits.max_data_bytes) {
    return OverLimit("data: the training files' bytes", "--max-data-bytes", data_bytes,
                     limits.max_data_bytes);
  }
  if (!spec.val_token_file().empty()) {
    const std::string& path = spec.val_token_file();
    if (!absl::EndsWith(path, ".u32") && !absl::EndsWith(path, ".u16")) {
      return Invalid("val_token_file", absl::StrCat(path, " is not a .u32 or .u16 token file"));
    }
    if (absl::Status s = CheckDataFile("val_token_file", path, &data_bytes); !s.ok()) return s;
  }
  if (spec.eval_every() > 0 && spec.val_token_file().empty() &&
      spec.data_case() != v1::JobSpec::kPreparedData) {
    return Invalid("eval_every", "needs held-out data: val_token_file or prepared_data");
  }
  if (spec.data_case() != v1::JobSpec::kTokenFile &&
      spec.data_case() != v1::JobSpec::kPreparedData && vocab < 256) {
    return Invalid(spec.model_case() == v1::JobSpec::kInit ? "init.vocab_size" : "model_dir",
                   absl::StrCat("byte-level data (text files or the built-in corpus) needs a "
                                "vocabulary of at least 256, the model has ",
                                vocab));
  }

  if (!spec.checkpoint_dir().empty()) {
    std::error_code ec;
    if (fs::exists(spec.checkpoint_dir(), ec) && !fs::is_directory(spec.checkpoint_dir(), ec)) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint_dir: ", spec.checkpoint_dir(),
                                                        " exists and is not a directory"));
    }
  }
  return absl::OkStatus();
}

bool JobIsMamba2(const v1::JobSpec& spec) {  // init makes Mamba-1 models only
  return spec.model_case() == v1::JobSpec::kModelDir &&
         ModelTypeOfDir(spec.model_dir()) == "mamba2";
}

ModelType JobModelType(const v1::JobSpec& spec) {
  return JobIsMamba2(spec) ? ModelType::kMamba2 : ModelType::kMamba;
}

template <>
absl::StatusOr<ModelParams<float>> JobParams<Family<MambaConfig>>(const v1::JobSpec& spec) {
  return JobModelParams(spec);
}

template <>
absl::StatusOr<Mamba2Params<float>> JobParams<Family<Mamba2Config>>(const v1::JobSpec& spec) {
  return LoadMamba2ModelDir<float>(spec.model_dir());
}

absl::StatusOr<ModelParams<float>> JobModelParams(const v1::JobSpec& spec) {
  if (spec.model_case() == v1::JobSpec::kModelDir) return LoadModelDir<float>(spec.model_dir());
  absl::StatusOr<MambaConfig> c = ConfigFromInit(spec.init());
  if (!c.ok()) return c.status();
  return InitParams<float>(*c, spec.init().seed());
}

absl::StatusOr<JobDataSet> JobData(const v1::JobSpec& spec, const JobLimits& limits,
                                   int64_t vocab_size) {
  const ReadOptions read{.regular_only = true, .max_bytes = limits.max_data_bytes};
  JobDataSet out;
  if (spec.data_case() == v1::JobSpec::kTokenFile) {
    absl::StatusOr<TokenData> t = TokenData::Map(spec.token_file(), read);
    if (!t.ok()) return t.status();
    out.corpus = *std::move(t);
  } else if (spec.data_case() == v1::JobSpec::kPreparedData) {
    absl::StatusOr<train::PreparedData> data = train::LoadPrepared(spec.prepared_data());
    if (!data.ok()) return data.status();
    if (absl::Status s = train::CheckVocabulary(*data, vocab_size); !s.ok()) return s;
    out.corpus = std::move(data->train.tokens);
    out.doc_starts = std::move(data->train.starts);
    if (data->val) {
      out.val = std::move(data->val->tokens);
      out.val_doc_starts = std::move(data->val->starts);
    }
  } else {
    std::vector<std::string> files;
    if (spec.data_case() == v1::JobSpec::kTextFiles) {
      files.assign(spec.text_files().paths().begin(), spec.text_files().paths().end());
    } else {
      files = BuiltinCorpusFiles();
    }
    absl::StatusOr<std::vector<uint32_t>> bytes = ReadTextAsBytes(files, read);
    if (!bytes.ok()) return bytes.status();
    out.corpus = TokenData::FromIds(*std::move(bytes));
  }
  if (!spec.val_token_file().empty()) {
    absl::StatusOr<TokenData> v = TokenData::Map(spec.val_token_file(), read);
    if (!v.ok()) return v.status();
    out.val = *std::move(v);
    out.val_doc_starts.clear();  // a token file has no document index
  }
  return out;
}

train::TrainOptions JobTrainOptions(const v1::JobSpec& spec, int threads,
                                    std::string checkpoint_dir) {
  train::TrainOptions opt;
  opt.steps = spec.steps();
  opt.context = spec.context_length();
  opt.grad.chunk = spec.chunk() > 0 ? spec.chunk() : kDefaultChunk;
  opt.grad.spans = spec.spans();
  opt.grad.window = spec.window();
  opt.grad.storage = spec.storage().empty() ? Storage::kCompute : *ParseStorage(spec.storage());
  opt.grad.threads = threads;
  opt.adamw = AdamWFromSpec(spec.optimizer());
  opt.checkpoint_dir = std::move(checkpoint_dir);
  opt.checkpoint_every = spec.checkpoint_every();
  opt.batch_size = spec.batch_size() > 0 ? spec.batch_size() : 1;
  opt.order = spec.data_order().empty() ? train::DataOrder::kShuffled
                                        : *train::DataOrderFromName(spec.data_order());
  opt.data_seed = spec.seed();
  opt.eval_every = spec.eval_every();
  opt.eval_tokens = spec.eval_tokens();
  opt.resume = spec.resume().empty() ? train::ResumeMode::kAuto
                                     : *train::ResumeModeFromName(spec.resume());
  opt.keep_checkpoints = spec.keep_checkpoints() > 0 ? static_cast<int>(spec.keep_checkpoints()) : 2;
  opt.save_dtype = spec.save_dtype() == "bf16" ? DType::kBF16 : DType::kF32;
  if (spec.model_case() == v1::JobSpec::kModelDir) opt.source_model_dir = spec.model_dir();
  opt.reset_at_documents = spec.doc_boundaries() == "reset";  // the starts: JobData's
  return opt;
}

}  // namespace adjsh::coordinator
