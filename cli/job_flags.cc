#include "cli/job_flags.h"

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "engine/grad_options.h"
#include "train/dataset.h"
#include "google/protobuf/util/json_util.h"

namespace adjsh::cli {
namespace {

std::string Absolute(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.string();
}

// The job flags, mapped onto a JobSpec by SpecFromFlags; the defaults in their help are
// applied there.
struct JobFlag {
  const char* name;
  const char* value;
  const char* help;
};
constexpr JobFlag kJobFlags[] = {
    {"model", "DIR", "model to start from (default: a new model from the shape flags)"},
    {"hidden-size", "D", "width of a new model (default 128)"},
    {"layers", "K", "layers of a new model (default 4)"},
    {"vocab-size", "V", "vocabulary of a new model (default 256)"},
    {"state-size", "N", "SSM state size of a new model (default 16)"},
    {"conv-kernel", "W", "causal conv width of a new model (default 4)"},
    {"expand", "E", "inner width factor of a new model (default 2)"},
    {"dt-rank", "R", "dt rank of a new model, or auto = ceil(D/16) (default auto)"},
    {"layer-norm-epsilon", "EPS", "RMSNorm epsilon of a new model (default 1e-5)"},
    {"seed", "S", "initialisation seed of a new model (default 0)"},
    {"untied-head", "",
     "a new model with an LM head of its own (lm_head.weight) instead of the embedding"},
    {"data", "PREFIX.json",
     "corpus prepared by adjsh prepare (its manifest): its train split, and its held-out split "
     "as --val-data"},
    {"tokens", "FILE", "corpus as a token file (.u32/.u16; mapped, never read whole)"},
    {"text", "FILE[,FILE...]",
     "corpus as text files, bytes as tokens (default: the built-in corpus)"},
    {"context", "T", "tokens per sequence (default 16384)"},
    {"batch-size", "B",
     "sequences per step: the loss is the mean over all their targets, the gradient the sum of "
     "theirs in sequence order (default 1)"},
    {"data-order", "sequential|shuffled",
     "the corpus's windows of --context tokens in file order, or in a seeded shuffled order "
     "per epoch (default shuffled)"},
    {"data-seed", "S", "the shuffle's seed (default 0)"},
    {"doc-boundaries", "cross|reset",
     "with --data: reset: the recurrence and the conv do not cross a document start (the exact "
     "gradient of that masked model); cross: a window is one sequence (default cross)"},
    {"steps", "S", "optimizer steps (default 60)"},
    {"chunk", "C", "tokens per chunk, one kernel call (default 256)"},
    {"spans", "S",
     "spans per step, each owned by one worker (default: about T/16384, at least 8, at most "
     "one per chunk)"},
    {"window", "Wt",
     "truncated adjoint window (default: the exact gradient; in-process adjsh train only)"},
    {"storage", "full|bf16",
     "layer inputs and chunk states kept for the backward in f32 or bf16 (default full)"},
    {"lr", "LR", "peak learning rate (default 3e-3)"},
    {"warmup", "S", "linear warmup steps (default 10)"},
    {"min-lr-ratio", "R", "final learning rate as a fraction of the peak (default 0.1)"},
    {"weight-decay", "WD", "AdamW decoupled weight decay (default 0.1)"},
    {"beta1", "B1", "AdamW beta1 (default 0.9)"},
    {"beta2", "B2", "AdamW beta2 (default 0.95)"},
    {"eps", "EPS", "AdamW epsilon (default 1e-8)"},
    {"grad-clip", "G", "global gradient-norm clip, 0: off (default 1.0)"},
    {"val-data", "FILE",
     "held-out token file (.u32/.u16): its loss and perplexity every --eval-every steps"},
    {"eval-every", "N",
     "with held-out data: evaluate every N steps and after the last, 0: never (default 10)"},
    {"eval-tokens", "M",
     "with held-out data: its first M tokens, in sequences of --context, 0: all (default 0)"},
    {"checkpoint-dir", "DIR",
     "checkpoints (and resume) directory (default: adjsh train's ./adjsh-train; a "
     "coordinator's --state-dir/JOB_ID)"},
    {"checkpoint-every", "S", "steps between checkpoints, 0: only at the end (default 20)"},
    {"keep-checkpoints", "N", "the newest step folders of the run that are kept (default 2)"},
    {"expected-workers", "N",
     "workers the job should have; fewer for 5 minutes fires the AdjshWorkerShortfall alert "
     "(default: adjsh train's --workers, else none)"},
    {"save-dtype", "f32|bf16",
     "of each checkpoint's model.safetensors; bf16: half the bytes, a resume then starts from "
     "the rounded weights (default f32)"},
    {"resume", "auto|never|must",
     "auto: from the checkpoint directory's latest checkpoint if there is one; never: refused "
     "if it holds checkpoints; must: refused without one. A resume with another model, data, "
     "context, batch, order or optimizer is refused naming the field (default auto)"},
};

}  // namespace

void AddJobFlags(ArgParser& a) {
  for (const JobFlag& f : kJobFlags) {
    if (*f.value == '\0') {
      a.AddBool(f.name, f.help);  // a switch
    } else {
      a.Add(f.name, f.value, f.help);
    }
  }
}

bool AnyJobFlag(const ArgParser& a) {
  for (const JobFlag& f : kJobFlags)
    if (a.Has(f.name)) return true;
  return false;
}

absl::StatusOr<v1::JobSpec> SpecFromFlags(const ArgParser& a) {
  v1::JobSpec spec;
  auto integer = [&](const char* name, int64_t def, int64_t min) -> absl::StatusOr<int64_t> {
    if (!a.Has(name)) return def;
    return a.GetInt(name, min, int64_t{1} << 40);
  };
  static constexpr const char* kShape[] = {"hidden-size", "layers",  "vocab-size",
                                           "state-size",  "conv-kernel", "expand",
                                           "dt-rank",     "seed",   "layer-norm-epsilon",
                                           "untied-head"};
  if (a.Has("model")) {
    for (const char* f : kShape) {
      if (a.Has(f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--model and --", f, " exclude each other (the model has its shape)"));
      }
    }
    spec.set_model_dir(Absolute(a.Get("model")));
  } else {
    v1::InitConfig* init = spec.mutable_init();
    struct Shape {
      const char* name;
      int64_t def;
      void (v1::InitConfig::*set)(int64_t);
    };
    for (const Shape& s : {Shape{"hidden-size", 128, &v1::InitConfig::set_hidden_size},
                           Shape{"layers", 4, &v1::InitConfig::set_layers},
                           Shape{"vocab-size", 256, &v1::InitConfig::set_vocab_size},
                           Shape{"state-size", 16, &v1::InitConfig::set_state_size},
                           Shape{"conv-kernel", 4, &v1::InitConfig::set_conv_kernel},
                           Shape{"expand", 2, &v1::InitConfig::set_expand}}) {
      absl::StatusOr<int64_t> v = integer(s.name, s.def, 1);
      if (!v.ok()) return v.status();
      (init->*s.set)(*v);
    }
    if (a.Has("dt-rank") && a.Get("dt-rank") != "auto") {
      absl::StatusOr<int64_t> v = integer("dt-rank", 0, 1);
      if (!v.ok()) return v.status();
      init->set_dt_rank(*v);
    }
    absl::StatusOr<int64_t> seed = integer("seed", 0, 0);
    if (!seed.ok()) return seed.status();
    init->set_seed(static_cast<uint64_t>(*seed));
    init->set_untied_head(a.GetBool("untied-head"));
    if (a.Has("layer-norm-epsilon")) {
      absl::StatusOr<double> eps = a.GetDouble("layer-norm-epsilon");
      if (!eps.ok()) return eps.status();
      if (!(*eps > 0)) return absl::InvalidArgumentError("--layer-norm-epsilon must be > 0");
      init->set_layer_norm_epsilon(*eps);
    }
  }
  int sources = 0;
  for (const char* f : {"data", "tokens", "text"}) sources += a.Has(f) ? 1 : 0;
  if (sources > 1) {
    return absl::InvalidArgumentError("give one of --data, --tokens and --text");
  }
  if (a.Has("tokens")) spec.set_token_file(Absolute(a.Get("tokens")));
  if (a.Has("data")) spec.set_prepared_data(Absolute(a.Get("data")));
  if (a.Has("val-data")) spec.set_val_token_file(Absolute(a.Get("val-data")));
  // --data's held-out split, as far as this process can read the manifest (else the
  // coordinator that reads it decides): a corpus prepared with --val-fraction 0 has none, and
  // then evaluation is off by default.
  bool data_has_val = a.Has("data");
  if (a.Has("data") && !a.Has("val-data")) {
    absl::StatusOr<bool> has = train::HasHeldOutSplit(a.Get("data"));
    if (has.ok()) data_has_val = *has;
  }
  const bool held_out = a.Has("val-data") || data_has_val;
  for (const char* f : {"eval-every", "eval-tokens"}) {
    if (a.Has(f) && !held_out) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", f, " needs held-out data (--val-data, or --data with a held-out split",
          a.Has("data") ? absl::StrCat(": ", a.Get("data"), " has none") : std::string(), ")"));
    }
  }
  if (a.Has("text")) {
    for (const std::string& f :
         std::vector<std::string>(absl::StrSplit(a.Get("text"), ',', absl::SkipEmpty()))) {
      spec.mutable_text_files()->add_paths(Absolute(f));
    }
    if (spec.text_files().paths().empty()) return absl::InvalidArgumentError("--text is empty");
  }
  struct Int {
    const char* name;
    int64_t def, min;
    void (v1::JobSpec::*set)(int64_t);
  };
  for (const Int& f :
       {Int{"context", 16384, 2, &v1::JobSpec::set_context_length},
        Int{"steps", 60, 1, &v1::JobSpec::set_steps}, Int{"chunk", 256, 1, &v1::JobSpec::set_chunk},
        Int{"spans", 0, 0, &v1::JobSpec::set_spans},
        Int{"checkpoint-every", 20, 0, &v1::JobSpec::set_checkpoint_every},
        Int{"batch-size", 1, 1, &v1::JobSpec::set_batch_size},
        Int{"window", 0, 1, &v1::JobSpec::set_window},
        Int{"eval-every", held_out ? 10 : 0, 0, &v1::JobSpec::set_eval_every},
        Int{"eval-tokens", 0, 0, &v1::JobSpec::set_eval_tokens},
        Int{"keep-checkpoints", 2, 1, &v1::JobSpec::set_keep_checkpoints},
        Int{"expected-workers", 0, 0, &v1::JobSpec::set_expected_workers}}) {
    absl::StatusOr<int64_t> v = integer(f.name, f.def, f.min);
    if (!v.ok()) return v.status();
    (spec.*f.set)(*v);
  }
  absl::StatusOr<int64_t> data_seed = integer("data-seed", 0, 0);
  if (!data_seed.ok()) return data_seed.status();
  spec.set_seed(static_cast<uint64_t>(*data_seed));
  struct Choice {
    const char* name;
    std::initializer_list<const char*> values;
    void (v1::JobSpec::*set)(const std::string&);
  };
  for (const Choice& c : {Choice{"data-order", {"shuffled", "sequential"},
                                 &v1::JobSpec::set_data_order},
                          Choice{"resume", {"auto", "never", "must"}, &v1::JobSpec::set_resume},
                          Choice{"save-dtype", {"f32", "bf16"}, &v1::JobSpec::set_save_dtype},
                          Choice{"doc-boundaries", {"cross", "reset"},
                                 &v1::JobSpec::set_doc_boundaries}}) {
    if (!a.Has(c.name)) continue;
    const std::string v = a.Get(c.name);
    if (std::find(c.values.begin(), c.values.end(), v) == c.values.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", c.name, " must be ", absl::StrJoin(c.values, ", "), "; got '", v,
                       "'"));
    }
    (spec.*c.set)(v);
  }
  if (a.Has("storage")) {
    absl::StatusOr<Storage> storage = ParseStorage(a.Get("storage"));
    if (!storage.ok()) return storage.status();
    spec.set_storage(std::string(StorageName(*storage)));
  }
  v1::AdamW* o = spec.mutable_optimizer();
  if (a.Has("warmup")) {
    absl::StatusOr<int64_t> v = integer("warmup", 0, 0);
    if (!v.ok()) return v.status();
    o->set_warmup_steps(*v);
  }
  struct Real {
    const char* name;
    void (v1::AdamW::*set)(double);
  };
  for (const Real& f : {Real{"lr", &v1::AdamW::set_lr}, Real{"beta1", &v1::AdamW::set_beta1},
                        Real{"beta2", &v1::AdamW::set_beta2}, Real{"eps", &v1::AdamW::set_eps},
                        Real{"weight-decay", &v1::AdamW::set_weight_decay},
                        Real{"min-lr-ratio", &v1::AdamW::set_min_lr_ratio},
                        Real{"grad-clip", &v1::AdamW::set_grad_clip}}) {
    if (!a.Has(f.name)) continue;
    absl::StatusOr<double> v = a.GetDouble(f.name);
    if (!v.ok()) return v.status();
    (o->*f.set)(*v);
  }
  if (a.Has("checkpoint-dir")) {
    if (a.Get("checkpoint-dir").empty())
      return absl::InvalidArgumentError("--checkpoint-dir is empty");
    spec.set_checkpoint_dir(Absolute(a.Get("checkpoint-dir")));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> SpecFromFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  v1::JobSpec spec;
  const auto s = google::protobuf::util::JsonStringToMessage(*text, &spec);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec ", path, " is not a JobSpec in JSON: ", s.ToString()));
  }
  return spec;
}

}  // namespace adjsh::cli
