// Training checkpoints. A checkpoint directory root holds one folder per saved step and a
// pointer to the newest complete one:
//   root/step-00000120/config.json          HF config (loads in transformers / adjsh as a model)
//   root/step-00000120/model.safetensors    parameters, f32 (or bf16: save dtype), HF names
//   root/step-00000120/optimizer.safetensors  AdamW moments: exp_avg.<name>, exp_avg_sq.<name>
//   root/step-00000120/trainer_state.json   step, sequences consumed, data position, last loss,
//                                           AdamW step, the training definition
//   root/latest                             "step-00000120"
// A step folder is written under a temporary name and renamed when complete, then `latest` is
// replaced atomically: a crash at any point leaves the previous checkpoint intact and pointed to.
#ifndef ADJSH_TRAIN_CHECKPOINT_H_
#define ADJSH_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model.h"
#include "train/optimizer.h"

namespace adjsh::train {

struct TrainerState {
  int64_t step = 0;            // steps completed
  int64_t data_position = 0;   // first token of the next sequence (informational)
  double last_loss = 0;
  int64_t sequence = 0;        // sequences consumed (train/sampler.h); -1: unknown (an old
                               // checkpoint: data_position / context)
  // The training definition (Trainer::Definition), a JSON object; empty in checkpoints written
  // before it was recorded.
  std::string definition;
};

// P: the model type's parameter struct (engine/families/family.h), Mamba-1's by default.
template <typename P = ModelParams<float>>
struct Checkpoint {
  std::string path;  // the step folder
  P params;
  AdamWState<P> optimizer;
  TrainerState state;
};

// Writes a checkpoint for state.step and points `latest` at it. Then removes step folders of
// `written` (the steps this run saved before, oldest first; the new one is appended) beyond the
// newest `keep` (>= 1): a run never deletes a folder it did not write itself.
// model_dtype: of model.safetensors (f32, or bf16 for a smaller model; the optimizer state and
// a resume's weights then come from bf16-rounded values). side_files: copied into the folder
// (the source model's tokenizer files, so that each checkpoint is a complete model folder).
template <typename P>
absl::Status SaveCheckpoint(const std::string& root, const P& params,
                            const AdamWState<P>& optimizer, const TrainerState& state,
                            std::vector<int64_t>& written, int keep = 2,
                            DType model_dtype = DType::kF32,
                            const std::vector<std::string>& side_files = {});

// Creates root if it is missing and checks that a file can be made in it (one is created and
// removed), so that a run learns before its first step, not at its first checkpoint, that it
// could never save one. FAILED_PRECONDITION naming root and the reason otherwise.
absl::Status CheckCheckpointDirWritable(const std::string& root);

// The tokenizer and generation files of a Hugging Face model folder that exist there
// (tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt,
// tokenizer.model, added_tokens.json, generation_config.json), as paths.
std::vector<std::string> ModelSideFiles(const std::string& model_dir);

// What to do when root holds checkpoints but `latest` is missing, empty, names a folder that is
// not there, or names one that does not load.
enum class ResumeFallback {
  kRefuse,         // an error naming what is wrong (nothing is started, nothing deleted)
  kNewestComplete  // the newest step folder that loads, with `note` saying so
};

// The checkpoint `latest` points to (surrounding whitespace in it is ignored). NOT_FOUND only
// when root holds no checkpoint at all (no `latest` and no step folder): a fresh start.
// FAILED_PRECONDITION (with kRefuse) when it holds one but no loadable latest one (a model of
// another type does not load). *note, if non-null, says which folder a fallback took and why.
template <typename P = ModelParams<float>>
absl::StatusOr<Checkpoint<P>> LoadLatestCheckpoint(const std::string& root,
                                                ResumeFallback fallback = ResumeFallback::kRefuse,
                                                std::string* note = nullptr);

}  // namespace adjsh::train

#endif  // ADJSH_TRAIN_CHECKPOINT_H_
