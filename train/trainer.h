// The training loop: each step takes batch_size windows of `context` tokens of the corpus in
// the sampler's order (train/sampler.h), computes the loss and gradient of each (by default
// in-process with the adjoint engine; the distributed service plugs in its own gradient
// source), adds them in sequence order, clips the global gradient norm, and applies AdamW with
// warmup + cosine; evaluates on held-out data every eval_every steps; checkpoints every N steps
// and resumes from the latest, refusing a checkpoint of another training definition.
// Deterministic: the same options and corpus give bitwise the same weights, resumed or not.
#ifndef ADJSH_TRAIN_TRAINER_H_
#define ADJSH_TRAIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model.h"
#include "common/token_data.h"
#include "engine/grad_options.h"
#include "engine/grad_result.h"
#include "engine/evaluate.h"
#include "engine/segments.h"
#include "nlohmann/json.hpp"
#include "train/checkpoint.h"
#include "train/dir_lock.h"
#include "engine/families/families.h"
#include "train/optimizer.h"
#include "train/sampler.h"

namespace adjsh::train {

// Whether a run resumes from its checkpoint directory.
enum class ResumeMode {
  kAuto,   // from the latest checkpoint if there is one, else a fresh start
  kNever,  // a fresh start; refused when the directory already holds checkpoints
  kMust    // from the latest checkpoint; refused when there is none
};
absl::StatusOr<ResumeMode> ResumeModeFromName(std::string_view name);  // auto | never | must

struct TrainOptions {
  int64_t steps = 60;
  int64_t context = 16384;  // T: tokens per sequence
  int64_t batch_size = 1;   // B: sequences per step (their gradients added in sequence order)
  DataOrder order = DataOrder::kShuffled;  // of the windows, per epoch (train/sampler.h)
  uint64_t data_seed = 0;                  // the shuffle's key
  GradOptions grad;         // chunk, window, threads
  AdamWOptions adamw;
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 0;  // 0: only at the end (when checkpoint_dir is set)
  int keep_checkpoints = 2;      // the newest step folders this run wrote that are kept
  DType save_dtype = DType::kF32;  // of each checkpoint's model.safetensors
  std::string source_model_dir;    // non-empty: its tokenizer files go into every checkpoint
  ResumeMode resume = ResumeMode::kAuto;
  // A checkpoint directory with checkpoints but no loadable latest one: an error, or (by the
  // user's explicit choice) a resume from the newest complete step folder (resume_note says so).
  ResumeFallback resume_fallback = ResumeFallback::kRefuse;
  // Empty: every next-token target counts. Else one entry per corpus token, sliced with the
  // corpus into each step's GradOptions::loss_mask (which targets count in the loss).
  std::vector<uint8_t> loss_mask;
  // Held-out evaluation (Trainer::set_validation): every eval_every steps and after the last
  // (0: never), the mean loss of the validation data's first eval_tokens tokens (0: all of
  // them) in sequences of `context`, forward only (engine/evaluate.h) with the gradient's
  // chunk, threads and device, in the training process.
  int64_t eval_every = 0;
  int64_t eval_tokens = 0;
  // --doc-boundaries reset: the recurrence and the conv do not cross a document start
  // (doc_starts: ascending token offsets in the corpus); each sequence's gradient is that of
  // its documents' pieces combined (engine/segments.h).
  bool reset_at_documents = false;
  std::vector<int64_t> doc_starts;
  // The held-out data's document starts, where its evaluation resets too (EvalOptions).
  std::vector<int64_t> val_doc_starts;
};

struct StepReport {
  int64_t step = 0, steps = 0;  // step: 1-based index of the step just done
  double loss = 0, grad_norm = 0, lr = 0, seconds = 0, tokens_per_s = 0, eta_seconds = 0;
  int64_t targets = 0, correct = -1;  // GradResult's (summed over the batch), before the update
  StepProfile profile;                // the span schedule's cost (GradResult::profile)
  // After the step's update, when it was evaluated: the held-out loss, its tokens and seconds.
  bool evaluated = false;
  double val_loss = 0, val_seconds = 0;
  int64_t val_tokens = 0;
};

// The gradients of one optimizer step's pieces (its sequences, cut at document starts when they
// reset; each with TrainOptions::grad and its slice of the loss mask), one result per piece in
// order: in-process one after the other by default, through the workers all at once
// (coordinator/task_service.h ComputeGradients). The trainer combines them (engine/segments.h).
// P: the model type's parameter struct (engine/families/family.h).
template <typename P>
using GradientSourceFor =
    std::function<absl::StatusOr<std::vector<typename FamilyOf<P>::Grad>>(
        const P& params, std::span<const GradPiece> pieces)>;
using GradientSource = GradientSourceFor<ModelParams<float>>;

// The loop for either model type: Trainer (Mamba-1) and Mamba2Trainer below; the in-process
// gradient source by default, a local cluster's or a coordinator's job's when set (the options
// a model type cannot take are refused by Init: engine/capabilities.h).
template <typename P>
class BasicTrainer {
 public:
  using Source = GradientSourceFor<P>;
  // corpus: at least context tokens, all < vocab_size (checked by Init); a mapped token file
  // is read one step's slice at a time.
  BasicTrainer(P params, TokenData corpus, TrainOptions options);
  BasicTrainer(P params, std::vector<uint32_t> corpus, TrainOptions options)
      : BasicTrainer(std::move(params), TokenData::FromIds(std::move(corpus)),
                     std::move(options)) {}

  // Validates options and data; resumes from checkpoint_dir's latest checkpoint if there is one
  // (then `resumed()` is true and the step count continues from it).
  absl::Status Init();
  void set_gradient_source(Source source) { source_ = std::move(source); }
  // The held-out loss through this source instead of engine/evaluate.h: the sequences of the
  // validation data as forward-only span steps (GradOptions::forward_only; the gradient's chunk
  // and spans, the default spans where the last, shorter sequence cannot have them), batch_size
  // sequences per call. For the workers: their loss is bitwise the same for any number of them.
  void set_evaluation_source(Source source) { eval_source_ = std::move(source); }
  // The held-out data of TrainOptions::eval_every (before Init, which checks it).
  void set_validation(TokenData val) { val_ = std::move(val); }

  // Runs the remaining steps; on_step is called after every step. With `stop`: once it is set
  // (a signal handler's flag), the run ends after the step under way, its state saved as a
  // checkpoint (when it has a directory): CANCELLED naming the step, which a resume continues.
  absl::Status Run(const std::function<void(const StepReport&)>& on_step,
                   const std::atomic<bool>* stop = nullptr);

  // Saves a checkpoint of the state after the last completed step, unless there is nothing new
  // to save (no checkpoint dir, no step since the last save or the resume). For a run stopped
  // between steps (a shutdown): resuming from it continues exactly where it stopped.
  absl::Status SaveCheckpointNow();

  const P& params() const { return params_; }
  const TrainerState& state() const { return state_; }
  // The training definition a checkpoint records and a resume must match (TrainerState's
  // options): the model config, the data's fingerprint and size, context, batch, order, seed,
  // the gradient's definition (window, cotangent, loss mask) and the optimizer's settings. Not
  // the chunk, spans, threads or workers (how it is computed, not what), nor the step count (a
  // run may be extended; the learning-rate schedule follows the new total).
  nlohmann::json Definition() const;
  bool resumed() const { return resumed_; }
  // How the resume fell back to an older step folder than `latest` names; empty otherwise.
  const std::string& resume_note() const { return resume_note_; }

 private:
  using Grad = typename FamilyOf<P>::Grad;
  P params_;
  TokenData corpus_;
  TokenData val_;
  TrainOptions opt_;
  AdamWState<P> adamw_;
  TrainerState state_;
  Source source_, eval_source_;
  std::string resume_note_;
  DirLock dir_lock_;
  // The GradResult of a step's B sequences (the first batch_size from state_.sequence).
  absl::StatusOr<Grad> BatchGradient();
  // With a loss mask: INVALID_ARGUMENT naming the first step to come whose windows count no
  // target (that step would have no loss), else OK. A step's other windows, or pieces of them,
  // that count none are left out of its gradient (BatchGradient).
  absl::Status CheckMaskedSteps() const;
  // Holds checkpoint_dir (dir_lock_) for this trainer's life: FAILED_PRECONDITION when another
  // run holds it.
  absl::Status HoldCheckpointDir();
  // The held-out loss (TrainOptions::eval_tokens of val_ in sequences of the context): through
  // eval_source_ when set, else engine/evaluate.h in-process.
  absl::StatusOr<EvalResult> HeldOutLoss();
  // source's results for the pieces tokens[i] with options[i] (same sizes): one per piece, or
  // INTERNAL when the source returns another count.
  absl::StatusOr<std::vector<Grad>> Gradients(
      const Source& source, const std::vector<std::vector<uint32_t>>& tokens,
      const std::vector<GradOptions>& options) const;
  std::unique_ptr<SequenceSampler> sampler_;
  std::string data_fingerprint_, mask_fingerprint_;
  std::vector<int64_t> written_;  // the step folders this run saved, oldest first
  int64_t saved_step_ = 0;        // the step of the newest checkpoint this run saved or resumed
  bool resumed_ = false;
};

using Trainer = BasicTrainer<ModelParams<float>>;
using Mamba2Trainer = BasicTrainer<Mamba2Params<float>>;
extern template class BasicTrainer<ModelParams<float>>;
extern template class BasicTrainer<Mamba2Params<float>>;

}  // namespace adjsh::train

#endif  // ADJSH_TRAIN_TRAINER_H_
