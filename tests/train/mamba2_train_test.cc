// Training a Mamba-2 model (engine/families/family.h): the trainer's step is the gradient, clip and
// AdamW by hand, bit for bit; loss goes down; a resumed run is bitwise the straight one; the
// checkpoint's model folder loads as a Mamba-2 model; options its gradient lacks and a
// checkpoint of the other model type are refused by name. And the initialisation's streams.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>

#include "common/tokens.h"
#include "engine/mamba2_grad.h"
#include "common/mamba2_init.h"
#include "tests/common/test_util.h"
#include "tests/kernels/test_util.h"
#include "tests/train/lost_worker.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace adjsh::train {
namespace {

// D=16, K=2, N=8, head_dim 8 (H=4), G=2, W=4, V=256 (bytes), tied head unless told.
Mamba2Config TinyMamba2(bool tied = true) {
  Mamba2Config c;
  c.hidden_size = 16, c.num_hidden_layers = 2, c.state_size = 8, c.head_dim = 8;
  c.num_heads = 4, c.n_groups = 2, c.vocab_size = 256, c.tie_word_embeddings = tied;
  return c;
}

Mamba2Params<float> Init(const Mamba2Config& c, uint64_t seed) {
  absl::StatusOr<Mamba2Params<float>> p = InitMamba2Params<float>(c, seed);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

// A path for a test's checkpoint directory, not yet created; gone when the test process exits.
std::string TempDir(const std::string& name) { return adjsh::testing::ScratchPath(name); }

std::vector<uint32_t> Corpus() {
  absl::StatusOr<std::vector<uint32_t>> c = ReadTextAsBytes(BuiltinCorpusFiles());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::vector<uint32_t>(c->begin(), c->begin() + 50000) : std::vector<uint32_t>{};
}

Mamba2GradOptions Chunked(int64_t chunk, std::span<const uint8_t> mask = {}) {
  Mamba2GradOptions o;
  o.chunk = chunk;
  o.loss_mask = mask;
  return o;
}

TrainOptions SmallRun(int64_t steps) {
  TrainOptions o;
  o.steps = steps;
  o.context = 128;
  o.grad.chunk = 32;
  o.adamw.lr = 1e-2;
  o.adamw.warmup_steps = 2;
  return o;
}

void ExpectBitwiseEqual(Mamba2Params<float> a, Mamba2Params<float> b) {
  const std::vector<ParamRef<float>> x = ListParams(a), y = ListParams(b);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].name, y[i].name);
    ASSERT_TRUE(*x[i].values == *y[i].values) << x[i].name;
  }
}

TEST(Mamba2InitTest, StreamsByNameAndTheRecipesRanges) {
  const Mamba2Config c = TinyMamba2(false);
  ExpectBitwiseEqual(Init(c, 7), Init(c, 7));
  const Mamba2Params<float> a = Init(c, 7), b = Init(c, 8);
  EXPECT_NE(a.layers[0].in_proj, b.layers[0].in_proj);
  EXPECT_NE(a.embed, a.lm_head);  // the untied head has its own stream
  Mamba2Config deeper = c;
  deeper.num_hidden_layers = 3;  // layer 0's streams do not depend on the layer count
  EXPECT_EQ(Init(deeper, 7).layers[0].in_proj, a.layers[0].in_proj);
  for (const Mamba2Layer<float>& l : a.layers) {
    for (float x : l.A_log) EXPECT_TRUE(x >= 0 && x < std::log(16.0f)) << x;
    for (float x : l.dt_bias) {  // softplus(dt_bias) in [1e-3, 0.1]
      const double dt = std::log1p(std::exp(double(x)));
      EXPECT_TRUE(dt > 0.99e-3 && dt < 0.101) << dt;
    }
    for (float x : l.D) EXPECT_EQ(x, 1.0f);
    for (float x : l.gnorm) EXPECT_EQ(x, 1.0f);
  }
  Mamba2Config bad = c;
  bad.num_heads = 3;  // H P != E D
  EXPECT_EQ(InitMamba2Params<float>(bad, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Mamba2TrainerTest, OneStepIsTheGradientClipAndAdamWByHand) {
  const Mamba2Params<float> init = Init(TinyMamba2(), 3);
  const std::vector<uint32_t> corpus = Corpus();
  TrainOptions o = SmallRun(1);
  o.order = DataOrder::kSequential;
  o.adamw.grad_clip = 0.5;
  Mamba2Trainer t(init, corpus, o);
  ASSERT_TRUE(t.Init().ok());
  StepReport report;
  ASSERT_TRUE(t.Run([&](const StepReport& r) { report = r; }).ok());

  const std::span<const uint32_t> window(corpus.data(), o.context);
  absl::StatusOr<Mamba2GradResult<float>> g =
      Mamba2Gradient<float>(init, window, Chunked(o.grad.chunk));
  ASSERT_TRUE(g.ok()) << g.status();
  const double norm = GradNorm(g->grad);
  EXPECT_EQ(report.loss, g->loss);
  EXPECT_EQ(report.grad_norm, norm);
  ASSERT_GT(norm, o.adamw.grad_clip);  // the clip is exercised
  Mamba2Params<float> p = init;
  AdamWState st = NewAdamWState(init.config);
  ASSERT_TRUE(AdamWStep(o.adamw, LearningRate(o.adamw, 0, 1),
                        static_cast<float>(o.adamw.grad_clip / norm), p, g->grad, st)
                  .ok());
  ExpectBitwiseEqual(t.params(), p);
}

TEST(Mamba2TrainerTest, LossGoesDownAndAResumedRunIsBitwiseTheStraightOne) {
  const Mamba2Params<float> init = Init(TinyMamba2(false), 5);
  const std::vector<uint32_t> corpus = Corpus();
  std::vector<double> losses;
  Mamba2Trainer straight(init, corpus, SmallRun(16));
  ASSERT_TRUE(straight.Init().ok());
  ASSERT_TRUE(straight.Run([&](const StepReport& r) { losses.push_back(r.loss); }).ok());
  ASSERT_EQ(losses.size(), 16u);
  double first = 0, last = 0;
  for (int i = 0; i < 4; ++i) first += losses[i], last += losses[12 + i];
  EXPECT_LT(last, first * 0.9) << "first " << first / 4 << " last " << last / 4;

  // The same run killed during step 12 (after the checkpoint at step 8), then restarted.
  const std::string dir = TempDir("mamba2_resume");
  TrainOptions broken = SmallRun(16);
  broken.checkpoint_dir = dir;
  broken.checkpoint_every = 8;
  {
    Mamba2Trainer a(init, corpus, broken);
    ASSERT_TRUE(a.Init().ok());
    a.set_gradient_source(LostOnCall<Mamba2Params<float>>(12));
    EXPECT_EQ(a.Run(nullptr).code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(a.state().step, 11);
  }  // the killed run's process is gone (it held the directory)
  std::optional<Mamba2Trainer> held(std::in_place, Init(TinyMamba2(false), 99), corpus,
                                    broken);  // the weights come from disk
  Mamba2Trainer& b = *held;
  ASSERT_TRUE(b.Init().ok());
  ASSERT_TRUE(b.resumed());
  EXPECT_EQ(b.state().step, 8);
  ASSERT_TRUE(b.Run(nullptr).ok());
  ExpectBitwiseEqual(b.params(), straight.params());
  EXPECT_EQ(b.state().last_loss, straight.state().last_loss);

  // The step folder is a Mamba-2 model folder (untied head included), the final weights.
  absl::StatusOr<Mamba2Params<float>> saved =
      LoadMamba2ModelDir<float>(dir + "/step-00000016");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_FALSE(saved->config.tie_word_embeddings);
  ExpectBitwiseEqual(*saved, b.params());
  held.reset();  // its directory is free again
  // A Mamba-1 trainer refuses this directory by the model type.
  Trainer mamba1(InitParams<float>(adjsh::testing::SmallConfig(2, 16, 4, 4, 1, 256), 1), corpus,
                 broken);
  const absl::Status refused = mamba1.Init();
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("mamba2"), std::string::npos) << refused;
  EXPECT_EQ(refused.message().find("in use"), std::string::npos) << refused;
}

TEST(Mamba2TrainerTest, RefusesTheOptionsItsGradientLacksByName) {
  const Mamba2Params<float> init = Init(TinyMamba2(), 1);
  const std::vector<uint32_t> corpus = Corpus();
  const std::pair<std::function<void(TrainOptions&)>, const char*> cases[] = {
      {[](TrainOptions& o) { o.grad.window = 16; }, "window"},
      {[](TrainOptions& o) { o.grad.cotangent = Cotangent::kTopOfStack; }, "top-of-stack"},
  };
  for (const auto& [change, name] : cases) {
    TrainOptions o = SmallRun(2);
    change(o);
    Mamba2Trainer t(init, corpus, o);
    const absl::Status s = t.Init();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << name << ": " << s;
    EXPECT_NE(s.message().find(name), std::string::npos) << s;
  }
}

TEST(Mamba2TrainerTest, ALossMaskCountsOnlyItsTargets) {
  const Mamba2Params<float> init = Init(TinyMamba2(), 2);
  const std::vector<uint32_t> corpus = Corpus();
  std::vector<uint8_t> mask(corpus.size(), 0);
  for (size_t i = 0; i < mask.size(); i += 3) mask[i] = 1;
  TrainOptions o = SmallRun(1);
  o.order = DataOrder::kSequential;
  o.loss_mask = mask;
  Mamba2Trainer t(init, corpus, o);
  ASSERT_TRUE(t.Init().ok());
  StepReport report;
  ASSERT_TRUE(t.Run([&](const StepReport& r) { report = r; }).ok());
  const std::span<const uint8_t> m(mask.data(), o.context);
  absl::StatusOr<Mamba2GradResult<float>> g = Mamba2Gradient<float>(
      init, std::span<const uint32_t>(corpus.data(), o.context),
      Chunked(o.grad.chunk, m));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(report.targets, CountedTargets(m, o.context));
  EXPECT_EQ(report.targets, 42);  // positions 3, 6, ..., 126
  EXPECT_EQ(report.loss, g->loss);
  EXPECT_GE(report.correct, 0);
  // The masked loss is the mean of the unmasked per-target losses it keeps: the full loss
  // differs from it.
  absl::StatusOr<Mamba2GradResult<float>> full = Mamba2Gradient<float>(
      init, std::span<const uint32_t>(corpus.data(), o.context), Chunked(o.grad.chunk));
  ASSERT_TRUE(full.ok());
  EXPECT_NE(full->loss, g->loss);
  EXPECT_EQ(full->correct, -1);
}

}  // namespace
}  // namespace adjsh::train
