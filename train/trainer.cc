#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokens.h"
#include "engine/evaluate.h"
#include "engine/segments.h"
#include "engine/span_plan.h"

namespace adjsh::train {

absl::StatusOr<ResumeMode> ResumeModeFromName(std::string_view name) {
  if (name == "auto") return ResumeMode::kAuto;
  if (name == "never") return ResumeMode::kNever;
  if (name == "must") return ResumeMode::kMust;
  return absl::InvalidArgumentError(
      absl::StrCat("resume must be auto, never or must, got '", std::string(name), "'"));
}

template <typename P>
BasicTrainer<P>::BasicTrainer(P params, TokenData corpus, TrainOptions options)
    : params_(std::move(params)),
      corpus_(std::move(corpus)),
      opt_(std::move(options)),
      adamw_(NewAdamWState(params_.config)) {
  source_ = [](const P& p, std::span<const GradPiece> pieces)
      -> absl::StatusOr<std::vector<Grad>> {
    std::vector<Grad> out;
    for (const GradPiece& piece : pieces) {
      absl::StatusOr<Grad> g = FamilyOf<P>::Gradient(p, piece);
      if (!g.ok()) return g.status();
      out.push_back(*std::move(g));
    }
    return out;
  };
}

template <typename P>
absl::Status BasicTrainer<P>::SaveCheckpointNow() {
  if (opt_.checkpoint_dir.empty() || state_.step == saved_step_) return absl::OkStatus();
  const std::vector<std::string> side =
      opt_.source_model_dir.empty() ? std::vector<std::string>{}
                                    : ModelSideFiles(opt_.source_model_dir);
  if (absl::Status s = SaveCheckpoint(opt_.checkpoint_dir, params_, adamw_, state_, written_,
                                      opt_.keep_checkpoints, opt_.save_dtype, side);
      !s.ok())
    return s;
  saved_step_ = state_.step;
  return absl::OkStatus();
}

template <typename P>
absl::Status BasicTrainer<P>::Init() {
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
  if (opt_.batch_size < 1) return absl::InvalidArgumentError("batch size must be >= 1");
  if (absl::Status s = Supports({.model = FamilyOf<P>::kType, .options = opt_.grad,
                                 .training = true});
      !s.ok())
    return s;
  if (opt_.keep_checkpoints < 1) {
    return absl::InvalidArgumentError("keep_checkpoints must be >= 1 (the newest is always kept)");
  }
  if (absl::Status s = corpus_.CheckInVocab(params_.config.vocab_size); !s.ok()) return s;
  sampler_ = std::make_unique<SequenceSampler>(corpus_.size(), opt_.context, opt_.order,
                                               opt_.data_seed);
  if (!opt_.loss_mask.empty() && static_cast<int64_t>(opt_.loss_mask.size()) != corpus_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the loss mask has %d entries for a corpus of %d tokens", opt_.loss_mask.size(),
        corpus_.size()));
  }
  data_fingerprint_ = corpus_.Fingerprint();
  if (!opt_.loss_mask.empty()) mask_fingerprint_ = FingerprintBytes(opt_.loss_mask);
  if (opt_.eval_every < 0 || opt_.eval_tokens < 0) {
    return absl::InvalidArgumentError("eval_every and eval_tokens must be >= 0");
  }
  if (opt_.eval_every > 0) {
    if (val_.size() < 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "evaluation every %d steps needs validation data of at least 2 tokens (it has %d; "
          "eval_every 0 turns evaluation off)",
          opt_.eval_every, val_.size()));
    }
    if (opt_.eval_tokens == 1) {  // one token predicts nothing: a held-out loss of no targets
      return absl::InvalidArgumentError(
          "eval_tokens must be 0 (all the validation data) or >= 2 (one token has no target)");
    }
    if (absl::Status s = val_.CheckInVocab(params_.config.vocab_size); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("validation data: ", s.message()));
    }
  }
  const nlohmann::json definition = Definition();
  const std::string definition_text = definition.dump();
  state_.definition = definition_text;
  if (opt_.checkpoint_dir.empty()) {
    if (opt_.resume == ResumeMode::kMust) {
      return absl::InvalidArgumentError("resume must: there is no checkpoint directory");
    }
    return absl::OkStatus();
  }
  // Held before its checkpoints are read, when it exists (else once made, below).
  if (std::filesystem::is_directory(opt_.checkpoint_dir)) {
    if (absl::Status s = HoldCheckpointDir(); !s.ok()) return s;
  }
  absl::StatusOr<Checkpoint<P>> ck =
      LoadLatestCheckpoint<P>(opt_.checkpoint_dir, opt_.resume_fallback, &resume_note_);
  if (absl::IsNotFound(ck.status())) {
    if (opt_.resume == ResumeMode::kMust) {
      return absl::FailedPreconditionError(absl::StrCat(
          "resume must: ", opt_.checkpoint_dir, " holds no checkpoint to resume from"));
    }
    // Learnt now, not at step 100.
    if (absl::Status s = CheckCheckpointDirWritable(opt_.checkpoint_dir); !s.ok()) return s;
    return HoldCheckpointDir();
  }
  if (opt_.resume == ResumeMode::kNever) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resume never: ", opt_.checkpoint_dir, " already holds checkpoints",
        ck.ok() ? absl::StrCat(" (the latest of step ", ck->state.step, ")") : "",
        "; choose another checkpoint directory, or remove them"));
  }
  if (!ck.ok()) return ck.status();
  if (FamilyOf<P>::Shape(ck->params.config) != FamilyOf<P>::Shape(params_.config)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint in ", ck->path, " is of a different model configuration"));
  }
  if (!ck->state.definition.empty()) {  // checkpoints before it was recorded are not checked
    const nlohmann::json was = nlohmann::json::parse(ck->state.definition, nullptr, false);
    for (const auto& [key, value] : was.items()) {
      const auto it = definition.find(key);
      if (it != definition.end() && *it == value) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot resume from ", ck->path, ": it was trained with a different ", key, " (",
          value.dump(), "; now ", it == definition.end() ? "none" : it->dump(),
          "). Resume with the same options, or start afresh in another checkpoint directory "
          "(--resume never)"));
    }
  }
  params_ = std::move(ck->params);
  adamw_ = std::move(ck->optimizer);
  state_ = ck->state;
  state_.definition = definition_text;
  // A checkpoint from before the sequence count: its data position in windows of the context.
  if (state_.sequence < 0) state_.sequence = state_.data_position / opt_.context;
  saved_step_ = state_.step;
  resumed_ = true;
  return CheckCheckpointDirWritable(opt_.checkpoint_dir);
}

template <typename P>
absl::Status BasicTrainer<P>::HoldCheckpointDir() {
  if (dir_lock_.held()) return absl::OkStatus();
  absl::StatusOr<DirLock> lock = DirLock::Hold(opt_.checkpoint_dir);
  if (!lock.ok()) return lock.status();
  dir_lock_ = *std::move(lock);
  return absl::OkStatus();
}

template <typename P>
nlohmann::json BasicTrainer<P>::Definition() const {
  const AdamWOptions& o = opt_.adamw;
  return nlohmann::json{
      {"model", nlohmann::json::parse(FamilyOf<P>::Shape(params_.config), nullptr, false)},
      {"data", data_fingerprint_},
      {"loss_mask", mask_fingerprint_},
      {"context", opt_.context},
      {"batch_size", opt_.batch_size},
      {"order", std::string(DataOrderName(opt_.order))},
      {"data_seed", opt_.data_seed},
      {"window", opt_.grad.window},
      {"cotangent", opt_.grad.cotangent == Cotangent::kExact ? "exact" : "top-of-stack"},
      {"doc_boundaries", opt_.reset_at_documents ? "reset" : "cross"},
      {"lr", o.lr},
      {"warmup", o.warmup_steps},
      {"min_lr_ratio", o.min_lr_ratio},
      {"weight_decay", o.weight_decay},
      {"beta1", o.beta1},
      {"beta2", o.beta2},
      {"eps", o.eps},
      {"grad_clip", o.grad_clip}};
}

template <typename P>
absl::StatusOr<std::vector<typename BasicTrainer<P>::Grad>> BasicTrainer<P>::Gradients(
    const Source& source, const std::vector<std::vector<uint32_t>>& tokens,
    const std::vector<GradOptions>& options) const {
  std::vector<GradPiece> pieces;
  for (size_t i = 0; i < tokens.size(); ++i) pieces.push_back(GradPiece{tokens[i], options[i]});
  absl::StatusOr<std::vector<Grad>> r = source(params_, pieces);
  if (r.ok() && r->size() != pieces.size()) {
    return absl::InternalError(
        absl::StrFormat("%d results for %d sequences", r->size(), pieces.size()));
  }
  return r;
}

template <typename P>
absl::StatusOr<typename BasicTrainer<P>::Grad> BasicTrainer<P>::BatchGradient() {
  const int64_t T = opt_.context;
  std::vector<std::vector<uint32_t>> tokens;  // each piece's
  std::vector<GradOptions> options;
  const std::span<const int64_t> doc_starts =
      opt_.reset_at_documents ? std::span<const int64_t>(opt_.doc_starts)
                              : std::span<const int64_t>();
  for (int64_t b = 0; b < opt_.batch_size; ++b) {
    const int64_t start = sampler_->Start(state_.sequence + b);
    for (const auto& [first, len] : PiecesOfWindow(start, T, doc_starts)) {
      std::span<const uint8_t> mask;  // the piece's slice, for whichever gradient source
      if (!opt_.loss_mask.empty()) {
        mask = std::span<const uint8_t>(opt_.loss_mask).subspan(start + first, len);
        // A piece none of whose targets count adds nothing to the step's mean: not computed
        // (the engine refuses a mask that counts no target).
        if (!CountsATarget(mask)) continue;
      }
      tokens.push_back(corpus_.Slice(start + first, len));
      options.push_back(opt_.grad);
      options.back().loss_mask = mask;
    }
  }
  if (tokens.empty()) {  // Run's CheckMaskedSteps refuses such a run before its first step
    return absl::FailedPreconditionError(absl::StrFormat(
        "step %d: the loss mask counts no target in its windows", state_.step + 1));
  }
  absl::StatusOr<std::vector<Grad>> parts = Gradients(source_, tokens, options);
  if (!parts.ok()) return parts.status();
  // The mean over every counted target of the batch (engine/segments.h): each piece's mean loss
  // and gradient weighted by its share of the targets, added in order.
  return CombineGradients(*std::move(parts));
}

template <typename P>
absl::StatusOr<EvalResult> BasicTrainer<P>::HeldOutLoss() {
  if (!eval_source_) {
    EvalOptions eo;
    eo.chunk = opt_.grad.chunk;
    eo.context = opt_.context;
    eo.max_tokens = opt_.eval_tokens;
    eo.threads = opt_.grad.threads;
    eo.device = opt_.grad.device;
    if (opt_.reset_at_documents) eo.doc_starts = opt_.val_doc_starts;
    return FamilyOf<P>::Evaluate(params_, val_, eo);
  }
  // The sequences Evaluate would cut, their losses weighted by their targets.
  const int64_t n = opt_.eval_tokens > 0 ? std::min(opt_.eval_tokens, val_.size()) : val_.size();
  const auto& c = params_.config;
  EvalResult r;
  const std::vector<std::pair<int64_t, int64_t>> sequences = EvalSequences(n, opt_.context);
  const std::span<const int64_t> doc_starts =
      opt_.reset_at_documents ? std::span<const int64_t>(opt_.val_doc_starts)
                              : std::span<const int64_t>();
  // batch_size sequences at a time: as many spans in flight as a training step has.
  for (size_t first = 0; first < sequences.size(); first += opt_.batch_size) {
    const size_t end = std::min(sequences.size(), first + static_cast<size_t>(opt_.batch_size));
    std::vector<std::vector<uint32_t>> tokens;  // each piece's
    std::vector<GradOptions> options;
    for (size_t i = first; i < end; ++i) {
      const auto [start, len] = sequences[i];
      for (const auto& [at, piece] : PiecesOfWindow(start, len, doc_starts)) {
        GradOptions& o = options.emplace_back(opt_.grad);
        o.forward_only = true;
        o.loss_mask = {};
        o.progress = nullptr;
        if (!SpanPlan::Make(piece, o.chunk, o.spans, c.num_hidden_layers, c.conv_kernel).ok())
          o.spans = 0;  // a short sequence or piece: the default spans for its length
        tokens.push_back(val_.Slice(start + at, piece));
      }
      r.sequences += 1;
      r.tokens += len;
    }
    absl::StatusOr<std::vector<Grad>> g = Gradients(eval_source_, tokens, options);
    if (!g.ok()) return g.status();
    for (size_t i = 0; i < tokens.size(); ++i) {  // in piece order, as Evaluate adds them
      r.loss_sum += (*g)[i].loss * static_cast<double>((*g)[i].targets);
      r.targets += (*g)[i].targets;
    }
  }
  return r;
}

template <typename P>
absl::Status BasicTrainer<P>::CheckMaskedSteps() const {
  if (opt_.loss_mask.empty()) return absl::OkStatus();
  const int64_t T = opt_.context;
  for (int64_t step = state_.step; step < opt_.steps; ++step) {
    const int64_t first_sequence = state_.sequence + (step - state_.step) * opt_.batch_size;
    bool counted = false;
    for (int64_t b = 0; b < opt_.batch_size && !counted; ++b) {
      const int64_t start = sampler_->Start(first_sequence + b);
      // The window's targets, tokens 1 to T - 1 (its pieces' targets together).
      counted = CountsATarget(std::span<const uint8_t>(opt_.loss_mask).subspan(start, T));
    }
    if (!counted) {
      const int64_t start = sampler_->Start(first_sequence);
      return absl::InvalidArgumentError(absl::StrFormat(
          "the loss mask counts no target in step %d's window%s (the first at tokens %d to %d): "
          "that step would have no loss; mark some of its targets, or change the data order "
          "or the step count",
          step + 1, opt_.batch_size > 1 ? "s" : "", start, start + T - 1));
    }
  }
  return absl::OkStatus();
}

template <typename P>
absl::Status BasicTrainer<P>::Run(const std::function<void(const StepReport&)>& on_step,
                                  const std::atomic<bool>* stop) {
  // Learnt before the first step, not at the step: nothing trained is lost.
  if (absl::Status s = CheckMaskedSteps(); !s.ok()) return s;
  const int64_t T = opt_.context * opt_.batch_size;
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = state_.step;
  while (state_.step < opt_.steps) {
    if (stop != nullptr && stop->load()) {  // between steps: nothing half done
      if (opt_.checkpoint_dir.empty() || state_.step == first_step) {
        return absl::CancelledError(absl::StrFormat(
            "stopped by a signal after step %d (%s)", state_.step,
            opt_.checkpoint_dir.empty() ? "no checkpoint directory: nothing saved"
                                        : "no step done in this run: nothing new to save"));
      }
      if (absl::Status s = SaveCheckpointNow(); !s.ok()) return s;
      return absl::CancelledError(absl::StrFormat(
          "stopped by a signal after step %d, saved in %s: the same command resumes there",
          state_.step, opt_.checkpoint_dir));
    }
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<Grad> g = BatchGradient();
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
    state_.sequence += opt_.batch_size;
    state_.data_position = sampler_->Start(state_.sequence);
    state_.last_loss = g->loss;
    const bool last = state_.step == opt_.steps;
    if (!opt_.checkpoint_dir.empty() &&
        (last || (opt_.checkpoint_every > 0 && state_.step % opt_.checkpoint_every == 0))) {
      if (absl::Status s = SaveCheckpointNow(); !s.ok()) return s;
    }
    StepReport r;
    if (opt_.eval_every > 0 && (last || state_.step % opt_.eval_every == 0)) {
      const auto eval_start = std::chrono::steady_clock::now();
      absl::StatusOr<EvalResult> val = HeldOutLoss();
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

template class BasicTrainer<ModelParams<float>>;
template class BasicTrainer<Mamba2Params<float>>;

}  // namespace adjsh::train
