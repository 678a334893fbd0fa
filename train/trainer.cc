#include "train/trainer.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokens.h"
#include "engine/evaluate.h"

namespace adjsh::train {

Trainer::Trainer(ModelParams<float> params, TokenData corpus, TrainOptions options)
    : params_(std::move(params)),
      corpus_(std::move(corpus)),
      opt_(std::move(options)),
      adamw_(NewAdamWState(params_.config)) {
  source_ = [](const ModelParams<float>& p, std::span<const uint32_t> tokens,
                const GradOptions& options) { return ComputeGradient<float>(p, tokens, options); };
}

absl::Status Trainer::SaveCheckpointNow() {
  if (opt_.checkpoint_dir.empty() || state_.step == saved_step_) return absl::OkStatus();
  if (absl::Status s = SaveCheckpoint(opt_.checkpoint_dir, params_, adamw_, state_, written_);
      !s.ok())
    return s;
  saved_step_ = state_.step;
  return absl::OkStatus();
}

absl::Status Trainer::Init() {
  if (opt_.steps < 1) return absl::InvalidArgumentError("steps must be >= 1");
  if (opt_.context < 2) return absl::InvalidArgumentError("context must be >= 2 tokens");
  if (static_cast<int64_t>(corpus_.size()) < opt_.context) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the corpus has %d tokens, fewer than the context of %d", corpus_.size(), opt_.context));
  }
  if (!(opt_.adamw.lr > 0) || !(opt_.adamw.beta1 >= 0 && opt_.adamw.beta1 < 1) ||
      !(opt_.adamw.beta2 >= 0 && opt_.adamw.beta2 < 1) || !(opt_.adamw.eps > 0) ||
      !(opt_.adamw.weight_decay >= 0) || !(opt_.adamw.grad_clip >= 0) ||
      opt_.adamw.warmup_steps < 0 || !(opt_.adamw.min_lr_ratio >= 0 && opt_.adamw.min_lr_ratio <= 1)) {
    return absl::InvalidArgumentError(
        "invalid optimizer settings (need lr > 0, 0 <= beta < 1, eps > 0, weight decay >= 0, "
        "grad clip >= 0, warmup >= 0, 0 <= min lr ratio <= 1)");
  }
  if (absl::Status s = corpus_.CheckInVocab(params_.config.vocab_size); !s.ok()) return s;
  if (!opt_.loss_mask.empty() && static_cast<int64_t>(opt_.loss_mask.size()) != corpus_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the loss mask has %d entries for a corpus of %d tokens", opt_.loss_mask.size(),
        corpus_.size()));
  }
  if (opt_.eval_every < 0 || opt_.eval_tokens < 0) {
    return absl::InvalidArgumentError("eval_every and eval_tokens must be >= 0");
  }
  if (opt_.eval_every > 0) {
    if (val_.size() < 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "evaluation every %d steps needs validation data of at least 2 tokens (it has %d)",
          opt_.eval_every, val_.size()));
    }
    if (absl::Status s = val_.CheckInVocab(params_.config.vocab_size); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("validation data: ", s.message()));
    }
  }
  if (opt_.checkpoint_dir.empty()) return absl::OkStatus();
  absl::StatusOr<Checkpoint> ck =
      LoadLatestCheckpoint(opt_.checkpoint_dir, opt_.resume_fallback, &resume_note_);
  if (absl::IsNotFound(ck.status())) return absl::OkStatus();
  if (!ck.ok()) return ck.status();
  if (ConfigToJson(ck->params.config) != ConfigToJson(params_.config)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint in ", ck->path, " is of a different model configuration"));
  }
  params_ = std::move(ck->params);
  adamw_ = std::move(ck->optimizer);
  state_ = ck->state;
  saved_step_ = state_.step;
  resumed_ = true;
  return absl::OkStatus();
}

absl::Status Trainer::Run(const std::function<void(const StepReport&)>& on_step) {
  const int64_t T = opt_.context, n = corpus_.size();
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = state_.step;
  while (state_.step < opt_.steps) {
    const auto start = std::chrono::steady_clock::now();
    if (state_.data_position + T > n) state_.data_position = 0;  // wrap to the corpus start
    const std::vector<uint32_t> tokens = corpus_.Slice(state_.data_position, T);
    if (!opt_.loss_mask.empty()) {  // the step's slice, for whichever gradient source
      opt_.grad.loss_mask =
          std::span<const uint8_t>(opt_.loss_mask).subspan(state_.data_position, T);
    }
    absl::StatusOr<GradResult<float>> g = source_(params_, tokens, opt_.grad);
    if (!g.ok()) return g.status();
    const double norm = GradNorm(g->grad);
    if (!std::isfinite(norm) || !std::isfinite(g->loss)) {
      return absl::InternalError(absl::StrFormat(
          "step %d: loss %g, gradient norm %g: training diverged", state_.step + 1, g->loss, norm));
    }
    const float clip = opt_.adamw.grad_clip > 0 && norm > opt_.adamw.grad_clip
                           ? static_cast<float>(opt_.adamw.grad_clip / norm)
                           : 1.0f;
    const double lr = LearningRate(opt_.adamw, state_.step, opt_.steps);
    if (absl::Status s = AdamWStep(opt_.adamw, lr, clip, params_, g->grad, adamw_); !s.ok())
      return absl::Status(s.code(), absl::StrCat("step ", state_.step + 1, ": ", s.message()));
    ++state_.step;
    state_.data_position += T;
    state_.last_loss = g->loss;
    const bool last = state_.step == opt_.steps;
    if (!opt_.checkpoint_dir.empty() &&
        (last || (opt_.checkpoint_every > 0 && state_.step % opt_.checkpoint_every == 0))) {
      if (absl::Status s = SaveCheckpointNow(); !s.ok()) return s;
    }
    StepReport r;
    if (opt_.eval_every > 0 && (last || state_.step % opt_.eval_every == 0)) {
      const auto eval_start = std::chrono::steady_clock::now();
      EvalOptions eo;
      eo.chunk = opt_.grad.chunk;
      eo.context = opt_.context;
      eo.max_tokens = opt_.eval_tokens;
      eo.threads = opt_.grad.threads;
      eo.device = opt_.grad.device;
      absl::StatusOr<EvalResult> val = Evaluate<float>(params_, val_, eo);
      if (!val.ok()) {
        return absl::Status(val.status().code(), absl::StrCat("step ", state_.step,
                                                              " evaluation: ",
                                                              val.status().message()));
      }
      r.evaluated = true;
      r.val_loss = val->loss();
      r.val_tokens = val->tokens;
      r.val_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
    }
    const auto now = std::chrono::steady_clock::now();
    r.step = state_.step, r.steps = opt_.steps, r.loss = g->loss, r.grad_norm = norm, r.lr = lr;
    r.targets = g->targets, r.correct = g->correct;
    r.profile = g->profile;
    // The step's own time (its tokens/s), without the evaluation's.
    r.seconds = std::chrono::duration<double>(now - start).count() - r.val_seconds;
    r.tokens_per_s = T / r.seconds;
    const double per_step = std::chrono::duration<double>(now - run_start).count() /
                            static_cast<double>(state_.step - first_step);
    r.eta_seconds = per_step * static_cast<double>(opt_.steps - state_.step);
    if (on_step) on_step(r);
  }
  return absl::OkStatus();
}

}  // namespace adjsh::train
