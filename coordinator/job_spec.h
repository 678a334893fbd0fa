// A JobSpec of the JobService (proto/adjsh.proto): the checks SubmitJob runs on it before
// queueing, and what the job's runner builds from it (model parameters, corpus, TrainOptions).
//
// ValidateJobSpec checks the whole spec (status codes as in the proto):
//   INVALID_ARGUMENT naming the field: no model source, empty model_dir, init shape out of range
//     (hidden_size/layers/vocab_size >= 1, others >= 0), context_length < 2, steps < 1,
//     chunk < 0 (0 = 256), window < 0, checkpoint_every < 0, optimizer values out of range
//     (lr > 0, beta1/beta2 in [0, 1), eps > 0, weight_decay >= 0, warmup_steps >= 0,
//     min_lr_ratio in [0, 1], grad_clip >= 0), dtype other than "", "f32" or "f64", a token
//     file with an extension other than .u32/.u16, text_files without paths, byte-level data
//     (text files or the built-in corpus) with a vocabulary under 256;
//   UNIMPLEMENTED: window > 0 (the truncated adjoint) and dtype "f64": the remote backward is
//     the exact f32 gradient only (adjsh train runs both in-process);
//   NOT_FOUND: model_dir, its config.json / model.safetensors, the token file or a text file
//     does not exist on the coordinator's filesystem;
//   FAILED_PRECONDITION: no data given and the built-in corpus (/usr/share/common-licenses) is
//     empty, or checkpoint_dir exists and is not a directory.
//   INVALID_ARGUMENT naming the limit: a spec over one of the coordinator's JobLimits
//     (context_length, or context_length x batch_size, over max_context; the model's layers K
//     over max_layers, hidden size D
//     over max_hidden, one parameter tensor in f32 over max_tensor_bytes, the whole model in
//     f32 over max_model_bytes, the data files over max_data_bytes);
//   FAILED_PRECONDITION: a data file that is not a regular file (a FIFO, a device).
// What only loading the model and data can tell is left to the job (job_service.h).
//
// Defaults of an unset field are those of `adjsh train`: chunk 256, AdamW of train/optimizer.h
// (documented in the proto), InitConfig's state_size 16, conv_kernel 4, expand 2, dt_rank auto;
// a spec without data trains on the built-in corpus as bytes (BuiltinCorpusFiles()). Step s
// takes batch_size windows of context_length tokens in the order of train/sampler.h (shuffled,
// keyed by JobSpec.seed, unless data_order is "sequential"), so a job and `adjsh train` with
// the same settings end with bitwise the same weights (`adjsh train` builds its JobSpec from the
// same flags as `adjsh submit`: cli/job_flags.h).
#ifndef ADJSH_COORDINATOR_JOB_SPEC_H_
#define ADJSH_COORDINATOR_JOB_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mamba2_config.h"
#include "common/model.h"
#include "common/token_data.h"
#include "engine/families/families.h"
#include "proto/adjsh.pb.h"
#include "train/trainer.h"

namespace adjsh::coordinator {

// Bounds on a spec as a request (INVALID_ARGUMENT past them, the value not echoed).
inline constexpr size_t kMaxSpecBytes = 64 << 10;   // the serialized spec
inline constexpr size_t kMaxPathBytes = 4096;       // each path (PATH_MAX)
inline constexpr int kMaxTextFiles = 1024;          // text_files.paths
inline constexpr int64_t kMaxKeepCheckpoints = 1 << 20;  // keep_checkpoints (an int's worth)

// Per-job size limits of a coordinator (`adjsh coordinator --max-context ...`): what a job may
// ask of its memory and of the workers' (a task's tensors grow with D and the parameters).
struct JobLimits {
  int64_t max_context = int64_t{1} << 24;  // T, tokens per step
  int64_t max_layers = 1024;               // K
  int64_t max_hidden = 65536;              // D
  // The largest parameter tensor in f32: max(V x D embeddings, (2 Di, D) in_proj, ...).
  uint64_t max_tensor_bytes = uint64_t{4} << 30;
  // The whole model in f32 (the coordinator holds it, its gradient and two AdamW moments).
  uint64_t max_model_bytes = uint64_t{4} << 30;
  // The job's training data on disk: one token file, or its text files together (text is held
  // as 4-byte ids, so 4x this in memory). Only regular files are read.
  uint64_t max_data_bytes = uint64_t{1} << 30;
};

// No limits: `adjsh train` on this machine (what fits is CheckModelFitsInMemory's to say).
inline JobLimits NoJobLimits() {
  JobLimits l;
  l.max_context = l.max_layers = l.max_hidden = INT64_MAX;
  l.max_tensor_bytes = l.max_model_bytes = l.max_data_bytes = UINT64_MAX;
  return l;
}

// Bytes of the model's largest parameter tensor in f32 (saturates at UINT64_MAX).
uint64_t LargestParamBytes(const MambaConfig& config);
uint64_t LargestParamBytes(const Mamba2Config& config);

// The spec's sizes as a request (kMaxSpecBytes, kMaxPathBytes, kMaxTextFiles): INVALID_ARGUMENT
// naming the field, the value not echoed. The first of ValidateJobSpec's checks.
absl::Status CheckSpecRequestSize(const v1::JobSpec& spec);

// Who runs a job: a coordinator's JobService, `adjsh train --workers` (its own trainer on a
// local cluster), or `adjsh train` without workers.
enum class JobRunner { kCoordinator, kLocalWorkers, kInProcess };

// The checks above, without loading the model or the data (the model_dir's config.json and a
// prepared corpus's manifest and indexes are read). The truncated window (window > 0) runs
// in-process only. A model_dir of either model type (model_type mamba or mamba2) is checked
// against the limits alike.
absl::Status ValidateJobSpec(const v1::JobSpec& spec, const JobLimits& limits = {},
                             JobRunner runner = JobRunner::kCoordinator);

// The config of an InitConfig (its defaults applied); INVALID_ARGUMENT naming the field.
absl::StatusOr<MambaConfig> ConfigFromInit(const v1::InitConfig& init);

// Whether the spec's model is a Mamba-2 model_dir (its config.json's model_type is "mamba2");
// init makes Mamba-1 models only.
bool JobIsMamba2(const v1::JobSpec& spec);
// The spec's model type (engine/families/families.h), by JobIsMamba2.
ModelType JobModelType(const v1::JobSpec& spec);

// The spec's model: loaded from model_dir, or initialised from init (its seed).
absl::StatusOr<ModelParams<float>> JobModelParams(const v1::JobSpec& spec);
// The spec's model as the family F's parameters (F of JobModelType): a Mamba-1 model by
// JobModelParams, a Mamba-2 one from its model_dir.
template <typename F>
absl::StatusOr<typename F::template Params<float>> JobParams(const v1::JobSpec& spec);
template <>
absl::StatusOr<ModelParams<float>> JobParams<Family<MambaConfig>>(const v1::JobSpec& spec);
template <>
absl::StatusOr<Mamba2Params<float>> JobParams<Family<Mamba2Config>>(const v1::JobSpec& spec);

// The spec's training tokens: the token file (mapped), a prepared corpus's train split (its
// vocabulary checked against vocab_size), or the text files / built-in corpus as bytes; and
// the held-out data: val_token_file, else a prepared corpus's held-out split. Regular files
// only, opened without blocking, each of at most limits.max_data_bytes.
struct JobDataSet {
  TokenData corpus;
  std::optional<TokenData> val;
  std::vector<int64_t> doc_starts;  // a prepared corpus's train split's document index
  std::vector<int64_t> val_doc_starts;  // and its held-out split's
};
absl::StatusOr<JobDataSet> JobData(const v1::JobSpec& spec, const JobLimits& limits,
                                   int64_t vocab_size);

// The trainer's options: the spec's, unset fields as adjsh train's defaults, the exact gradient
// (window 0). threads: for the coordinator's own work (0: one per core); checkpoint_dir: the
// effective one (the spec's, or the service's default for the job; empty: no checkpoints).
train::TrainOptions JobTrainOptions(const v1::JobSpec& spec, int threads,
                                    std::string checkpoint_dir);

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_JOB_SPEC_H_
