// Training: the schedule, AdamW against its formula, loss going down on the built-in corpus,
// and bitwise-identical weights after an interrupted run resumed from its checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>

#include "common/tokens.h"
#include "engine/adjoint_engine.h"
#include "engine/evaluate.h"
#include "tests/common/test_util.h"
#include "tests/kernels/test_util.h"
#include "tests/train/lost_worker.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace adjsh::train {
namespace {

// D=16, K=2, N=4, W=4, R=1, byte vocabulary.
MambaConfig TinyConfig() { return adjsh::testing::SmallConfig(2, 16, 4, 4, 1, 256); }

// A path for a test's checkpoint directory, not yet created; gone when the test process exits.
std::string TempDir(const std::string& name) { return adjsh::testing::ScratchPath(name); }

TEST(ScheduleTest, WarmupThenCosineToMinimum) {
  AdamWOptions o;
  o.lr = 1.0, o.warmup_steps = 4, o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(LearningRate(o, 0, 20), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(o, 3, 20), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, 4, 20), 1.0);  // cosine starts at the peak
  EXPECT_NEAR(LearningRate(o, 19, 20), 0.1, 1e-12);
  for (int s = 5; s < 20; ++s) EXPECT_LT(LearningRate(o, s, 20), LearningRate(o, s - 1, 20));
}

TEST(AdamWTest, DecayOnlyOnWeightsAndMatchesFormula) {
  EXPECT_TRUE(DecaysWeight("backbone.layers.3.mixer.in_proj.weight"));
  EXPECT_TRUE(DecaysWeight("backbone.embeddings.weight"));
  EXPECT_FALSE(DecaysWeight("backbone.layers.0.mixer.A_log"));
  EXPECT_FALSE(DecaysWeight("backbone.layers.0.mixer.D"));
  EXPECT_FALSE(DecaysWeight("backbone.layers.0.mixer.dt_proj.bias"));
  EXPECT_FALSE(DecaysWeight("backbone.layers.0.norm.weight"));
  EXPECT_FALSE(DecaysWeight("backbone.norm_f.weight"));

  const MambaConfig c = TinyConfig();
  AdamWOptions o;
  o.weight_decay = 0.1;
  ModelParams<float> p = InitParams<float>(c, 1);
  const ModelParams<float> p0 = p;
  ModelParams<float> g = ZeroParams<float>(c);
  g.layers[0].in_proj[5] = 0.5f;
  g.layers[0].A_log[2] = -2.0f;
  AdamWState st = NewAdamWState(c);
  const double lr = 0.01;
  for (int step = 1; step <= 2; ++step) ASSERT_TRUE(AdamWStep(o, lr, 1.0f, p, g, st).ok());
  // Two identical gradients: m / (1 - b1^2) = g and v / (1 - b2^2) = g^2, so each step moves
  // the parameter by lr * g / (|g| + eps) (plus decay where it applies).
  auto expect = [&](float x0, float gi, bool decay) {
    double x = x0;
    for (int step = 1; step <= 2; ++step) {
      if (decay) x *= 1 - lr * o.weight_decay;
      x -= lr * gi / (std::abs(gi) + o.eps);
    }
    return x;
  };
  EXPECT_NEAR(p.layers[0].in_proj[5], expect(p0.layers[0].in_proj[5], 0.5f, true), 1e-6);
  EXPECT_NEAR(p.layers[0].A_log[2], expect(p0.layers[0].A_log[2], -2.0f, false), 1e-6);
  EXPECT_NEAR(p.layers[0].in_proj[6], p0.layers[0].in_proj[6] * (1 - lr * 0.1) * (1 - lr * 0.1),
              1e-7);
  EXPECT_EQ(p.layers[0].Dskip[0], p0.layers[0].Dskip[0]);  // no gradient, no decay
  EXPECT_EQ(st.step, 2);
}

TrainOptions SmallRun(int64_t steps) {
  TrainOptions o;
  o.steps = steps;
  o.context = 512;
  o.grad.chunk = 64;
  o.grad.threads = 2;
  o.adamw.lr = 1e-2;
  o.adamw.warmup_steps = 2;
  return o;
}

std::vector<uint32_t> Corpus() {
  absl::StatusOr<std::vector<uint32_t>> c = ReadTextAsBytes(BuiltinCorpusFiles());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : std::vector<uint32_t>{};
}

TEST(TrainerTest, LossGoesDownOnTheBuiltinCorpus) {
  Trainer t(InitParams<float>(TinyConfig(), 3), Corpus(), SmallRun(30));
  ASSERT_TRUE(t.Init().ok());
  std::vector<double> losses;
  ASSERT_TRUE(t.Run([&](const StepReport& r) { losses.push_back(r.loss); }).ok());
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  const double last5 = (losses[25] + losses[26] + losses[27] + losses[28] + losses[29]) / 5;
  EXPECT_LT(last5, losses.front() - 1.5) << "first " << losses.front() << " last5 " << last5;
}

// The loss mask is sliced with the corpus: each step's loss is exactly the masked loss of its
// own tokens, and the accuracy on the counted targets is reported.
TEST(TrainerTest, LossMaskFollowsTheCorpus) {
  const std::vector<uint32_t> corpus = Corpus();
  TrainOptions o = SmallRun(3);
  o.order = DataOrder::kSequential;  // step 1 takes the corpus's first window
  o.loss_mask.assign(corpus.size(), 0);
  for (size_t t = 0; t < corpus.size(); t += 7) o.loss_mask[t] = 1;  // 73 targets in a step
  const ModelParams<float> init = InitParams<float>(TinyConfig(), 6);
  Trainer t(init, corpus, o);
  ASSERT_TRUE(t.Init().ok());
  std::vector<StepReport> reports;
  ASSERT_TRUE(t.Run([&](const StepReport& r) { reports.push_back(r); }).ok());
  ASSERT_EQ(reports.size(), 3u);
  GradOptions first = o.grad;
  first.loss_mask = std::span<const uint8_t>(o.loss_mask).subspan(0, o.context);
  const GradResult<float> want =
      ComputeGradient<float>(init, std::span(corpus).subspan(0, o.context), first).value();
  EXPECT_EQ(reports[0].loss, want.loss);
  EXPECT_EQ(reports[0].targets, want.targets);
  EXPECT_EQ(reports[0].correct, want.correct);
  for (const StepReport& r : reports) {
    EXPECT_EQ(r.targets, 73);
    EXPECT_GE(r.correct, 0);
    EXPECT_LE(r.correct, r.targets);
  }

  o.loss_mask.pop_back();
  Trainer bad(init, corpus, o);
  EXPECT_EQ(bad.Init().code(), absl::StatusCode::kInvalidArgument);
}

// Held-out evaluation every 2 steps and after the last: each reported loss is Evaluate's of the
// weights after that step (bitwise: the same computation), and the steps between report none;
// evaluating changes nothing in the training (the same weights as a run without it).
TEST(TrainerTest, EvaluationEveryNStepsIsThatOfTheWeightsThen) {
  const std::vector<uint32_t> corpus = Corpus();
  const std::vector<uint32_t> val(corpus.end() - 3000, corpus.end());
  const ModelParams<float> init = InitParams<float>(TinyConfig(), 8);
  TrainOptions o = SmallRun(5);
  o.eval_every = 2;
  o.eval_tokens = 1500;  // 2 sequences of 512 and one of 476
  Trainer t(init, corpus, o);
  t.set_validation(TokenData::FromIds(val));
  ASSERT_TRUE(t.Init().ok());
  std::vector<StepReport> reports;
  std::vector<ModelParams<float>> weights;
  ASSERT_TRUE(t.Run([&](const StepReport& r) {
                 reports.push_back(r);
                 weights.push_back(t.params());
               }).ok());
  ASSERT_EQ(reports.size(), 5u);
  const TokenData val_data = TokenData::FromIds(val);
  for (size_t i = 0; i < reports.size(); ++i) {
    const bool want = i == 1 || i == 3 || i == 4;
    EXPECT_EQ(reports[i].evaluated, want) << "step " << i + 1;
    if (!want) continue;
    EvalOptions eo;
    eo.chunk = o.grad.chunk;
    eo.context = o.context;
    eo.max_tokens = 1500;
    const EvalResult e = Evaluate<float>(weights[i], val_data, eo).value();
    EXPECT_EQ(reports[i].val_loss, e.loss()) << "step " << i + 1;
    EXPECT_EQ(reports[i].val_tokens, 1500);
  }
  TrainOptions plain = SmallRun(5);
  Trainer u(init, corpus, plain);
  ASSERT_TRUE(u.Init().ok());
  ASSERT_TRUE(u.Run(nullptr).ok());
  EXPECT_TRUE(testing::BitwiseEqual(u.params(), t.params()));

  Trainer no_val(init, corpus, o);  // eval_every without validation data
  EXPECT_EQ(no_val.Init().code(), absl::StatusCode::kInvalidArgument);
  Trainer bad_ids(init, corpus, o);
  bad_ids.set_validation(TokenData::FromIds({1, 2, 300}));
  const absl::Status s = bad_ids.Init();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("validation data"), std::string::npos) << s;
}

// A batch of 2: the step's loss is the mean over both sequences' targets and its gradient the
// targets-weighted sum of theirs in sequence order, bitwise (the same f32 operations); the
// sequences are the sampler's consecutive ones.
TEST(TrainerTest, BatchOfTwoIsTheFixedOrderSumOfItsSequences) {
  const std::vector<uint32_t> corpus = Corpus();
  const ModelParams<float> init = InitParams<float>(TinyConfig(), 12);
  TrainOptions o = SmallRun(1);
  o.batch_size = 2;
  o.data_seed = 5;
  std::vector<ModelParams<float>> grads;
  std::vector<double> losses;
  std::vector<std::vector<uint32_t>> seen;
  Trainer t(init, corpus, o);
  int calls = 0;  // the batch's sequences come in one call
  t.set_gradient_source([&](const ModelParams<float>& p, std::span<const GradPiece> pieces)
                            -> absl::StatusOr<std::vector<GradResult<float>>> {
    ++calls;
    std::vector<GradResult<float>> out;
    for (const GradPiece& piece : pieces) {
      seen.emplace_back(piece.tokens.begin(), piece.tokens.end());
      absl::StatusOr<GradResult<float>> g =
          ComputeGradient<float>(p, piece.tokens, piece.options);
      if (!g.ok()) return g.status();
      grads.push_back(g->grad), losses.push_back(g->loss);
      out.push_back(*std::move(g));
    }
    return out;
  });
  ASSERT_TRUE(t.Init().ok());
  std::vector<StepReport> reports;
  ASSERT_TRUE(t.Run([&](const StepReport& r) { reports.push_back(r); }).ok());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(calls, 1);
  const SequenceSampler sampler(static_cast<int64_t>(corpus.size()), o.context, o.order, 5);
  for (int b = 0; b < 2; ++b) {
    const int64_t start = sampler.Start(b);
    EXPECT_TRUE(std::equal(seen[b].begin(), seen[b].end(), corpus.begin() + start)) << b;
  }
  EXPECT_EQ(reports[0].targets, 2 * (o.context - 1));
  EXPECT_EQ(reports[0].loss, (losses[0] * 511 + losses[1] * 511) / 1022);
  // The same update from the summed gradient by hand: AdamW on w0 g0 + w1 g1.
  ModelParams<float> sum = grads[0];
  const float w = static_cast<float>(511.0 / 1022.0);
  std::vector<ParamRef<float>> d = ListParams(sum), g1 = ListParams(grads[1]);
  for (const ParamRef<float>& t : d)
    for (float& v : *t.values) v *= w;
  for (size_t q = 0; q < d.size(); ++q) {
    std::vector<float>& dq = *d[q].values;
    const std::vector<float>& vq = *g1[q].values;
    for (size_t k = 0; k < dq.size(); ++k) dq[k] += w * vq[k];
  }
  ModelParams<float> p = init;
  AdamWState st = NewAdamWState(init.config);
  const double norm = GradNorm(sum);
  const float clip = norm > o.adamw.grad_clip ? static_cast<float>(o.adamw.grad_clip / norm) : 1;
  ASSERT_TRUE(AdamWStep(o.adamw, LearningRate(o.adamw, 0, o.steps), clip, p, sum, st).ok());
  EXPECT_EQ(reports[0].grad_norm, norm);
  EXPECT_TRUE(testing::BitwiseEqual(p, t.params()));
}

// A resume checks the training definition in the checkpoint and names what differs; --resume
// never refuses a directory with checkpoints, must one without.
// A checkpoint directory no file can be made in is refused by Init, before the first step,
// instead of by the first save many steps later. /proc/self exists and takes no new file, even
// for root (the tests may run as root, for whom a mode 0555 directory is still writable).
TEST(TrainerTest, AnUnwritableCheckpointDirectoryIsRefusedBeforeTheFirstStep) {
  TrainOptions o = SmallRun(2);
  o.checkpoint_dir = "/proc/self";
  Trainer t(InitParams<float>(TinyConfig(), 3), Corpus(), o);
  const absl::Status s = t.Init();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("/proc/self is not writable"), std::string::npos) << s;
  o.checkpoint_dir = TempDir("writable") + "/made/here";  // made by Init, then written
  Trainer ok(InitParams<float>(TinyConfig(), 3), Corpus(), o);
  ASSERT_TRUE(ok.Init().ok());
  EXPECT_TRUE(std::filesystem::is_directory(o.checkpoint_dir));
  EXPECT_TRUE(std::filesystem::is_empty(o.checkpoint_dir));  // the probe file is gone
}

TEST(TrainerTest, ResumeRefusesADifferentDefinitionByName) {
  const ModelParams<float> init = InitParams<float>(TinyConfig(), 13);
  const std::vector<uint32_t> corpus = Corpus();
  TrainOptions o = SmallRun(2);
  o.checkpoint_dir = TempDir("definition");
  {
    Trainer t(init, corpus, o);
    ASSERT_TRUE(t.Init().ok());
    ASSERT_TRUE(t.Run(nullptr).ok());
  }
  auto refused = [&](TrainOptions changed, std::vector<uint32_t> data, const char* field) {
    Trainer t(init, std::move(data), changed);
    const absl::Status s = t.Init();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << field << ": " << s;
    EXPECT_NE(std::string(s.message()).find(std::string("different ") + field),
              std::string::npos) << s;
  };
  TrainOptions c = o;
  c.context = 256;
  refused(c, corpus, "context");
  c = o, c.batch_size = 2;
  refused(c, corpus, "batch_size");
  c = o, c.order = DataOrder::kSequential;
  refused(c, corpus, "order");
  c = o, c.adamw.lr = 2e-2;
  refused(c, corpus, "lr");
  std::vector<uint32_t> other = corpus;
  other[other.size() / 2] ^= 1;
  refused(o, other, "data");
  // The same definition resumes (threads and chunk are how, not what; more steps extend it).
  c = o, c.grad.threads = 1, c.grad.chunk = 32, c.steps = 3;
  {
    Trainer same(init, corpus, c);
    ASSERT_TRUE(same.Init().ok());
    EXPECT_TRUE(same.resumed());
  }  // (it holds the directory while it lives: TwoRunsCannotShareACheckpointDirectory)
  c = o, c.resume = ResumeMode::kNever;
  Trainer never(init, corpus, c);
  const absl::Status s = never.Init();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(s.message()).find("already holds checkpoints"), std::string::npos) << s;
  c = o, c.resume = ResumeMode::kMust, c.checkpoint_dir = TempDir("empty_must");
  Trainer must(init, corpus, c);
  EXPECT_EQ(must.Init().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TrainerTest, ResumedRunEndsWithBitwiseIdenticalWeights) {
  const ModelParams<float> init = InitParams<float>(TinyConfig(), 5);
  TrainOptions straight = SmallRun(6);
  straight.checkpoint_dir = TempDir("straight");
  straight.checkpoint_every = 3;
  Trainer a(init, Corpus(), straight);
  ASSERT_TRUE(a.Init().ok());
  ASSERT_TRUE(a.Run(nullptr).ok());

  // The same run, killed during step 5 (after the checkpoint at step 3), then restarted.
  TrainOptions broken = straight;
  broken.checkpoint_dir = TempDir("broken");
  {
    Trainer b(init, Corpus(), broken);
    ASSERT_TRUE(b.Init().ok());
    b.set_gradient_source(LostOnCall<ModelParams<float>>(5));
    EXPECT_EQ(b.Run(nullptr).code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(b.state().step, 4);
  }  // the killed run's process is gone

  Trainer c(InitParams<float>(TinyConfig(), 99), Corpus(), broken);  // weights come from disk
  ASSERT_TRUE(c.Init().ok());
  EXPECT_TRUE(c.resumed());
  EXPECT_EQ(c.state().step, 3);
  ASSERT_TRUE(c.Run(nullptr).ok());
  EXPECT_EQ(c.state().step, 6);
  EXPECT_TRUE(adjsh::testing::BitwiseEqual(a.params(), c.params()));
  EXPECT_EQ(a.state().last_loss, c.state().last_loss);
}

// Two runs on one checkpoint directory pruned and overwrote each other's step folders: the
// second is refused while the first holds the directory (in any process), and runs once it is
// gone. The directory lists as before: the lock is a flock on the directory itself.
TEST(TrainerTest, TwoRunsCannotShareACheckpointDirectory) {
  const ModelParams<float> init = InitParams<float>(TinyConfig(), 5);
  TrainOptions o = SmallRun(2);
  o.checkpoint_dir = TempDir("shared");
  std::optional<Trainer> first(std::in_place, init, Corpus(), o);
  ASSERT_TRUE(first->Init().ok());
  ASSERT_TRUE(first->Run(nullptr).ok());
  o.steps = 3;
  Trainer second(init, Corpus(), o);
  const absl::Status s = second.Init();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("in use by another training run"), std::string::npos)
      << s;
  first.reset();
  Trainer third(init, Corpus(), o);
  ASSERT_TRUE(third.Init().ok());
  EXPECT_TRUE(third.resumed());
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(o.checkpoint_dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000002"}));
}

// A finite gradient element that overflows g^2 (3e38, clipping off): the step is refused and
// nothing changes, so no checkpoint can hold a non-finite moment.
TEST(AdamWTest, AnUpdateThatWouldBeNonFiniteChangesNothing) {
  const MambaConfig c = TinyConfig();
  ModelParams<float> p = InitParams<float>(c, 3);
  ModelParams<float> g = ZeroParams<float>(c);
  AdamWState st = NewAdamWState(c);
  AdamWOptions o;
  o.grad_clip = 0;
  g.layers[0].dt_b[1] = 3e38f;
  const ModelParams<float> p0 = p;
  const absl::Status s = AdamWStep(o, 1e-3, 1.0f, p, g, st);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("backbone.layers.0.mixer.dt_proj.bias[1]"), std::string::npos) << s;
  EXPECT_EQ(st.step, 0);
  EXPECT_TRUE(adjsh::testing::BitwiseEqual(p, p0));
  EXPECT_TRUE(adjsh::testing::BitwiseEqual(st.v, ZeroParams<float>(c)));
  g.layers[0].dt_b[1] = 1.0f;  // a sane gradient still applies
  EXPECT_TRUE(AdamWStep(o, 1e-3, 1.0f, p, g, st).ok());
  EXPECT_EQ(st.step, 1);
}

TEST(CheckpointTest, LatestIsCompleteAndLeftoversAreIgnored) {
  const std::string dir = TempDir("ckpt");
  const MambaConfig c = TinyConfig();
  ModelParams<float> p = InitParams<float>(c, 1);
  AdamWState st = NewAdamWState(c);
  st.step = 7;
  st.m.norm_f[0] = 0.25f;
  TrainerState ts{7, 1234, 2.5, 0, ""};
  std::vector<int64_t> written;
  ASSERT_TRUE(SaveCheckpoint(dir, p, st, ts, written).ok());
  // A crash while writing the next one leaves a .tmp folder; it is never read.
  std::filesystem::create_directories(dir + "/step-00000008.tmp");
  absl::StatusOr<Checkpoint<>> ck = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->state.step, 7);
  EXPECT_EQ(ck->state.data_position, 1234);
  EXPECT_EQ(ck->optimizer.step, 7);
  EXPECT_EQ(ck->optimizer.m.norm_f[0], 0.25f);
  EXPECT_TRUE(adjsh::testing::BitwiseEqual(ck->params, p));
  // Older checkpoints beyond the newest two are removed.
  for (int64_t s : {8, 9, 10}) {
    ts.step = s;
    ASSERT_TRUE(SaveCheckpoint(dir, p, st, ts, written).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000008"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-00000009"));
  EXPECT_EQ(LoadLatestCheckpoint(dir)->state.step, 10);
  EXPECT_EQ(LoadLatestCheckpoint(TempDir("none")).status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointTest, FailedSaveKeepsThePreviousOneAndLeavesNothingBehind) {
  const std::string dir = TempDir("ckpt_fail");
  const MambaConfig c = TinyConfig();
  const ModelParams<float> p = InitParams<float>(c, 1);
  const AdamWState st = NewAdamWState(c);
  TrainerState ts{4, 100, 1.5, 0, ""};
  std::vector<int64_t> written;
  ASSERT_TRUE(SaveCheckpoint(dir, p, st, ts, written).ok());
  // `latest` cannot be replaced (a folder in its way): the save of step 6 fails after its step
  // folder was complete. That folder, which `latest` does not name, is removed with the
  // temporary one, and the error names the step and says the previous checkpoint is kept.
  std::filesystem::rename(dir + "/latest", dir + "/latest.kept");
  std::filesystem::create_directories(dir + "/latest/blocker");
  ts.step = 6;
  const absl::Status s = SaveCheckpoint(dir, p, st, ts, written);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot save the checkpoint of step 6"), std::string::npos) << s;
  EXPECT_NE(s.message().find("the previous one is kept"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000006"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000006.tmp"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-00000004/model.safetensors"));
  std::filesystem::remove_all(dir + "/latest");
  std::filesystem::rename(dir + "/latest.kept", dir + "/latest");
  EXPECT_EQ(LoadLatestCheckpoint(dir)->state.step, 4);
}

TEST(CheckpointTest, OnlyFoldersTheRunWroteArePruned) {
  // A run resumed from step 4 (written by an earlier run, as were steps 2 and 9): saving steps 5,
  // 6 and 7 with keep = 2 removes its own step 5 only; the earlier run's folders stay.
  const std::string dir = TempDir("ckpt_own");
  const MambaConfig c = TinyConfig();
  const ModelParams<float> p = InitParams<float>(c, 1);
  const AdamWState st = NewAdamWState(c);
  std::vector<int64_t> earlier;
  for (int64_t step : {2, 4, 9}) ASSERT_TRUE(SaveCheckpoint(dir, p, st, {step, 0, 1.0, 0, ""}, earlier, 5).ok());
  std::vector<int64_t> written;
  for (int64_t step : {5, 6, 7}) ASSERT_TRUE(SaveCheckpoint(dir, p, st, {step, 0, 1.0, 0, ""}, written).ok());
  for (const char* kept : {"step-00000002", "step-00000004", "step-00000009", "step-00000006",
                           "step-00000007"})
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + kept)) << kept;
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000005"));
  EXPECT_EQ(LoadLatestCheckpoint(dir)->state.step, 7);
}

// Every way `latest` can fail to give a checkpoint while the directory holds good ones: an
// error naming the problem (nothing deleted), or, by choice, the newest complete step folder.
TEST(CheckpointTest, BrokenLatestIsAnErrorOrAnExplicitFallback) {
  const MambaConfig c = TinyConfig();
  const ModelParams<float> p = InitParams<float>(c, 1);
  const AdamWState st = NewAdamWState(c);
  namespace fs = std::filesystem;
  struct Case {
    const char* name;
    std::function<void(const std::string&)> damage;
    const char* message;
  };
  auto write = [](const std::string& path, const std::string& text) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  const std::vector<Case> cases = {
      {"missing folder", [&](const std::string& d) { write(d + "/latest", "step-00000099"); },
       "names step-00000099, which does not load"},
      {"empty", [&](const std::string& d) { write(d + "/latest", ""); }, "is empty"},
      {"not a step", [&](const std::string& d) { write(d + "/latest", "../elsewhere"); },
       "not a step folder"},
      {"no latest", [&](const std::string& d) { fs::remove(d + "/latest"); },
       "holds step folders but no `latest`"},
      {"no model", [&](const std::string& d) { fs::remove(d + "/step-00000006/model.safetensors"); },
       "has no model.safetensors"},
      {"no optimizer",
       [&](const std::string& d) { fs::remove(d + "/step-00000006/optimizer.safetensors"); },
       "has no optimizer.safetensors"},
      {"no trainer state",
       [&](const std::string& d) { fs::remove(d + "/step-00000006/trainer_state.json"); },
       "has no trainer_state.json"},
  };
  for (const Case& k : cases) {
    const std::string dir = TempDir(std::string("ckpt_broken_") + k.name);
    std::vector<int64_t> written;
    for (int64_t step : {4, 6}) ASSERT_TRUE(SaveCheckpoint(dir, p, st, {step, 0, 1.0, 0, ""}, written).ok());
    k.damage(dir);
    const absl::StatusOr<Checkpoint<>> refused = LoadLatestCheckpoint(dir);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << k.name;
    EXPECT_NE(refused.status().message().find(k.message), std::string::npos)
        << k.name << ": " << refused.status();
    EXPECT_TRUE(fs::exists(dir + "/step-00000004/model.safetensors")) << k.name;
    std::string note;
    const absl::StatusOr<Checkpoint<>> fell_back =
        LoadLatestCheckpoint(dir, ResumeFallback::kNewestComplete, &note);
    ASSERT_TRUE(fell_back.ok()) << k.name << ": " << fell_back.status();
    const bool six_loads = fs::exists(dir + "/step-00000006/model.safetensors") &&
                           fs::exists(dir + "/step-00000006/optimizer.safetensors") &&
                           fs::exists(dir + "/step-00000006/trainer_state.json");
    EXPECT_EQ(fell_back->state.step, six_loads ? 6 : 4) << k.name;
    EXPECT_NE(note.find("resuming from step-0000000"), std::string::npos) << note;
  }
  // A trailing newline in `latest` (an edit by hand) is not damage.
  const std::string dir = TempDir("ckpt_newline");
  std::vector<int64_t> written;
  ASSERT_TRUE(SaveCheckpoint(dir, p, st, {3, 0, 1.0, 0, ""}, written).ok());
  write(dir + "/latest", "step-00000003\n");
  EXPECT_EQ(LoadLatestCheckpoint(dir)->state.step, 3);
}

}  // namespace
}  // namespace adjsh::train
