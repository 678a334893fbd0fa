// Training checkpoints. A checkpoint directory root holds one folder per saved step and a
// pointer to the newest complete one:
//   root/step-00000120/config.json          HF config (loads in transformers / adjsh as a model)
//   root/step-00000120/model.safetensors    parameters, f32, HF names
//   root/step-00000120/optimizer.safetensors  AdamW moments: exp_avg.<name>, exp_avg_sq.<name>
//   root/step-00000120/trainer_state.json   step, data position, last loss, AdamW step
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
  int64_t data_position = 0;   // first token of the next step's window
  double last_loss = 0;
};

struct Checkpoint {
  std::string path;  // the step folder
  ModelParams<float> params;
  AdamWState optimizer;
  TrainerState state;
};

// Writes a checkpoint for state.step and points `latest` at it. Then removes step folders of
// `written` (the steps this run saved before, oldest first; the new one is appended) beyond the
// newest `keep` (>= 1): a run never deletes a folder it did not write itself.
absl::Status SaveCheckpoint(const std::string& root, const ModelParams<float>& params,
                            const AdamWState& optimizer, const TrainerState& state,
                            std::vector<int64_t>& written, int keep = 2);

// What to do when root holds checkpoints but `latest` is missing, empty, names a folder that is
// not there, or names one that does not load.
enum class ResumeFallback {
  kRefuse,         // an error naming what is wrong (nothing is started, nothing deleted)
  kNewestComplete  // the newest step folder that loads, with `note` saying so
};

// The checkpoint `latest` points to (surrounding whitespace in it is ignored). NOT_FOUND only
// when root holds no checkpoint at all (no `latest` and no step folder): a fresh start.
// FAILED_PRECONDITION (with kRefuse) when it holds one but no loadable latest one. *note, if
// non-null, says which folder a fallback took and why.
absl::StatusOr<Checkpoint> LoadLatestCheckpoint(const std::string& root,
                                                ResumeFallback fallback = ResumeFallback::kRefuse,
                                                std::string* note = nullptr);

}  // namespace adjsh::train

#endif  // ADJSH_TRAIN_CHECKPOINT_H_
