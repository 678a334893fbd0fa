// AdamW with PyTorch's semantics, the warmup + cosine learning-rate schedule, and global
// gradient-norm clipping. Parameters and moments are f32, in either model type's parameter
// struct P (ModelParams<float>, Mamba2Params<float>), walked as its ListParams list.
#ifndef ADJSH_TRAIN_OPTIMIZER_H_
#define ADJSH_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/model.h"
#include "common/mamba2_model.h"

namespace adjsh::train {

struct AdamWOptions {
  double lr = 3e-3;            // peak learning rate
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;   // decoupled; not applied to A_log, D, norms and biases
  int64_t warmup_steps = 10;   // linear warmup from lr / warmup_steps to lr
  double min_lr_ratio = 0.1;   // cosine decay from lr to lr * min_lr_ratio at the last step
  double grad_clip = 1.0;      // global L2 norm; 0: no clipping
};

// Learning rate at step s (0-based) of total steps.
double LearningRate(const AdamWOptions& opt, int64_t step, int64_t total_steps);

// Whether a parameter (HF name) gets weight decay: the projection and conv weights and the
// embedding do; A_log, D, the norms and the biases do not (as in Mamba's training recipe).
bool DecaysWeight(const std::string& name);

// Global L2 norm of a gradient, accumulated in double in parameter order.
template <typename P>
double GradNorm(P& grad);

template <typename P>
struct AdamWState {
  int64_t step = 0;  // updates applied so far
  P m, v;
};

AdamWState<ModelParams<float>> NewAdamWState(const MambaConfig& config);
AdamWState<Mamba2Params<float>> NewAdamWState(const Mamba2Config& config);

// One update with learning rate lr: grad is scaled by clip_scale first (1: no clipping).
// Per element, in PyTorch's order: p *= 1 - lr wd; m = b1 m + (1 - b1) g;
// v = b2 v + (1 - b2) g^2; p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
// FAILED_PRECONDITION, with nothing changed, when any new value would be NaN or Inf.
template <typename P>
absl::Status AdamWStep(const AdamWOptions& opt, double lr, float clip_scale, P& params, P& grad,
                       AdamWState<P>& state);

}  // namespace adjsh::train

#endif  // ADJSH_TRAIN_OPTIMIZER_H_
