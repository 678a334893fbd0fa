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

// Writes a checkpoint for state.step; keeps the newest `keep` step folders (>= 1).
absl::Status SaveCheckpoint(const std::string& root, const ModelParams<float>& params,
                            const AdamWState& optimizer, const TrainerState& state, int keep = 2);

// The checkpoint `root/latest` points to. NOT_FOUND when root has none.
absl::StatusOr<Checkpoint> LoadLatestCheckpoint(const std::string& root);

}  // namespace adjsh::train

#endif  // ADJSH_TRAIN_CHECKPOINT_H_
