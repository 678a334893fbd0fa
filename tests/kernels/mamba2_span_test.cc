// The Mamba-2 span tasks (engine/span_math.h) under the one ledger (engine/span_ledger.h,
// engine/families/mamba2.h): run task by task they give Mamba2Gradient's bits; a span lost at any
// task and rebuilt from the ledger's inputs alone ends bitwise the same; any span count gives the
// same gradient up to f64 rounding; a forward-only plan gives the full plan's loss bits; a task
// the kept values do not serve is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "engine/mamba2_grad.h"
#include "common/mamba2_init.h"
#include "engine/span_work.h"
#include "engine/span_ledger.h"
#include "engine/span_plan.h"
#include "tests/kernels/test_util.h"
#include "engine/span_tensors.h"
#include "kernels/mamba2_chunk_ops.h"

namespace adjsh {
namespace {

// D=16, K=3, N=8, head_dim 4 (H=8), G=2, W=4, V=40; untied unless told.
Mamba2Config Config(bool tied = false) {
  Mamba2Config c;
  c.hidden_size = 16, c.num_hidden_layers = 3, c.state_size = 8, c.head_dim = 4;
  c.num_heads = 8, c.n_groups = 2, c.vocab_size = 40, c.tie_word_embeddings = tied;
  return c;
}

template <typename T>
Mamba2Params<T> Init(const Mamba2Config& c, uint64_t seed) {
  absl::StatusOr<Mamba2Params<T>> p = InitMamba2Params<T>(c, seed);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

std::vector<uint32_t> Tokens(int64_t n, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> t(n);
  for (uint32_t& x : t) x = static_cast<uint32_t>(rng() % V);
  return t;
}

template <typename T>
void ExpectSameBits(Mamba2GradResult<T> a, Mamba2GradResult<T> b) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << a.loss << " vs " << b.loss;
  EXPECT_EQ(a.correct, b.correct);
  const std::vector<ParamRef<T>> x = ListParams(a.grad), y = ListParams(b.grad);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].values->size(), y[i].values->size()) << x[i].name;
    EXPECT_EQ(std::memcmp(x[i].values->data(), y[i].values->data(),
                          x[i].values->size() * sizeof(T)),
              0)
        << x[i].name;
  }
}

// Runs the plan's tasks in id order (a topological order) on one Mamba2SpanWork per span;
// lose_at >= 0 drops that task's span just before it, to be rebuilt by replay. wire: every
// task's inputs and result go through their tensors (engine/span_tensors.h) and back.
template <typename T>
Mamba2GradResult<T> RunTasks(const Mamba2Params<T>& params, const std::vector<uint32_t>& tokens,
                             const SpanPlan& plan, std::span<const uint8_t> mask,
                             int64_t lose_at = -1, bool wire = false) {
  const Mamba2Config& c = params.config;
  SpanLedger<T, Mamba2Params> ledger(params, plan, tokens, mask);
  const std::unique_ptr<Backend<T>> backend = MakeBackend<T>(Device{}).value();
  const LayerModel<Mamba2Params<T>> model = MakeLayerModel(params, *backend).value();
  std::vector<std::unique_ptr<Mamba2SpanWork<T>>> work(plan.spans());
  int64_t built = 0, lost = 0;
  for (int64_t id = 0; id < plan.num_tasks(); ++id) {
    const SpanTask& task = plan.task(id);
    if (id == lose_at && work[task.span]) work[task.span].reset(), lost = 1;
    if (!work[task.span] || !work[task.span]->Ready(task)) {
      work[task.span] = std::make_unique<Mamba2SpanWork<T>>(
          model, plan, task.span, ledger.SpanTokens(task.span), ledger.SpanMask(task.span),
          ledger.n_targets(), Storage::kCompute, "");
      for (const auto& [step, in] : ledger.Replay(id)) {
        Mamba2SpanOutputs<T> discard;
        EXPECT_TRUE(work[task.span]->Run(step, in, discard).ok());
      }
      built += 1;
    }
    SpanInputs<T> in = ledger.Inputs(id);
    if (wire) {
      TensorMap sent;
      PutSpanInputs<T>(c, plan, task, in, "", sent);
      in = TakeSpanInputs<T>(c, plan, task, "", sent).value();
      EXPECT_TRUE(sent.empty());
    }
    SpanResultOf<T, Mamba2Config> r;
    const absl::Status s = work[task.span]->Run(task, in, r.out);
    EXPECT_TRUE(s.ok()) << s;
    if (wire) {
      TensorMap sent = PutSpanResult<T>(c, plan, task, r);
      EXPECT_EQ(HasPartials(c, plan, task, sent),
                task.phase == SpanPhase::kBackward ||
                    (task.phase == SpanPhase::kForward && task.layer + 1 == plan.layers()));
      r = TakeSpanResult<T>(c, plan, task, sent).value();
    }
    ledger.Apply(id, std::move(r.out));
  }
  EXPECT_EQ(built, plan.spans() + lost);  // each span built once, the lost one again
  return ledger.Finish();
}

TEST(Mamba2SpanTest, TasksInIdOrderGiveTheGradientsBits) {
  const Mamba2Params<float> params = Init<float>(Config(), 3);
  const std::vector<uint32_t> tokens = Tokens(300, 40, 4);
  const SpanPlan plan = SpanPlan::Make(300, 32, 4, 3, 4).value();
  Mamba2GradOptions o;
  o.chunk = 32, o.spans = 4, o.threads = 2;
  ExpectSameBits(RunTasks(params, tokens, plan, {}),
                 Mamba2Gradient(params, tokens, o).value());
}

TEST(Mamba2SpanTest, ARebuiltSpanGivesTheSameBits) {
  const Mamba2Params<float> params = Init<float>(Config(true), 5);
  const std::vector<uint32_t> tokens = Tokens(250, 40, 6);
  const std::vector<uint8_t> mask = testing::EveryThirdLeftOut(250);
  const SpanPlan plan = SpanPlan::Make(250, 20, 4, 3, 4).value();
  const Mamba2GradResult<float> undisturbed = RunTasks(params, tokens, plan, mask);
  EXPECT_GT(undisturbed.correct, -1);
  for (int64_t lose_at = 0; lose_at < plan.num_tasks(); lose_at += 2) {
    SCOPED_TRACE(lose_at);
    ExpectSameBits(undisturbed, RunTasks(params, tokens, plan, mask, lose_at));
  }
}

// The span combines are exact up to rounding: in f64, every span count and chunk gives the one
// gradient to ~1e-15 relative (1e-12 leaves room for the sums' reassociation at T = 300).
TEST(Mamba2SpanTest, AnySpanCountGivesTheSameGradientInF64) {
  const Mamba2Params<double> params = Init<double>(Config(), 7);
  const std::vector<uint32_t> tokens = Tokens(300, 40, 8);
  Mamba2GradOptions one;
  one.chunk = 300, one.spans = 1;
  Mamba2GradResult<double> ref = Mamba2Gradient(params, tokens, one).value();
  const std::vector<ParamRef<double>> r = ListParams(ref.grad);
  for (const auto& [chunk, spans] : std::vector<std::pair<int64_t, int64_t>>{
           {7, 5}, {64, 3}, {1, 60}, {16, 19}, {300, 1}}) {
    SCOPED_TRACE(::testing::Message() << "chunk " << chunk << " spans " << spans);
    Mamba2GradOptions o;
    o.chunk = chunk, o.spans = spans, o.threads = 2;
    Mamba2GradResult<double> got = Mamba2Gradient(params, tokens, o).value();
    EXPECT_NEAR(got.loss, ref.loss, 1e-13 * std::abs(ref.loss));
    const std::vector<ParamRef<double>> g = ListParams(got.grad);
    for (size_t i = 0; i < g.size(); ++i) {
      double diff = 0, norm = 0;
      for (size_t q = 0; q < g[i].values->size(); ++q) {
        const double a = (*g[i].values)[q], b = (*r[i].values)[q];
        diff += (a - b) * (a - b), norm += b * b;
      }
      EXPECT_LE(std::sqrt(diff), 1e-12 * std::sqrt(norm) + 1e-300) << g[i].name;
    }
  }
}

TEST(Mamba2SpanTest, AForwardOnlyPlanGivesTheFullPlansLoss) {
  const Mamba2Params<float> params = Init<float>(Config(), 9);
  const std::vector<uint32_t> tokens = Tokens(200, 40, 10);
  std::vector<uint8_t> mask(200, 1);
  mask[5] = mask[17] = 0;
  const SpanPlan full = SpanPlan::Make(200, 25, 3, 3, 4).value();
  const SpanPlan fwd = SpanPlan::Make(200, 25, 3, 3, 4, /*forward_only=*/true).value();
  const Mamba2GradResult<float> a = RunTasks(params, tokens, full, mask);
  const Mamba2GradResult<float> b = RunTasks(params, tokens, fwd, mask);
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << a.loss << " vs " << b.loss;
  EXPECT_EQ(a.correct, b.correct);
  EXPECT_EQ(a.targets, b.targets);
}

// Every task's tensors carry what the ledger reads: through them, the same bits.
TEST(Mamba2SpanTest, TheWireFormCarriesEveryTaskExactly) {
  const Mamba2Params<float> params = Init<float>(Config(), 11);
  const std::vector<uint32_t> tokens = Tokens(180, 40, 12);
  std::vector<uint8_t> mask(180, 1);
  mask[9] = 0;
  const SpanPlan plan = SpanPlan::Make(180, 16, 4, 3, 4).value();
  ExpectSameBits(RunTasks(params, tokens, plan, mask),
                 RunTasks(params, tokens, plan, mask, -1, /*wire=*/true));
}

// A Mamba-2 result is checked against Mamba-2's names and shapes: a Mamba-1 layer's names, a
// misshapen partial or an extra tensor is refused, naming it.
TEST(Mamba2SpanTest, AResultNotOfItsShapesIsRefusedByName) {
  const Mamba2Params<float> params = Init<float>(Config(), 13);
  const Mamba2Config& c = params.config;
  const SpanPlan plan = SpanPlan::Make(60, 10, 2, 3, 4).value();
  const SpanTask task{SpanPhase::kBackward, 2, 1};
  SpanResultOf<float, Mamba2Config> r;
  for (const Mamba2LayerSlot<float>& slot : Mamba2LayerSlots<float>())
    (r.out.grad.*slot.member).assign(ShapeNumel(slot.shape(c)), 0.5f);
  r.out.du_halo_prev.assign(3 * c.hidden_size, 0.25f);
  const TensorMap good = PutSpanResult<float>(c, plan, task, r);
  EXPECT_EQ(good.count("backbone.layers.2.mixer.dt_bias"), 1u);
  TensorMap bad = good;
  EXPECT_TRUE(TakeSpanResult<float>(c, plan, task, bad).ok());
  bad = good;
  bad.erase("backbone.layers.2.mixer.A_log");
  absl::Status s = TakeSpanResult<float>(c, plan, task, bad).status();
  EXPECT_NE(s.message().find("backbone.layers.2.mixer.A_log"), std::string::npos) << s;
  bad = good;
  bad["backbone.layers.2.mixer.D"].shape = {c.num_heads + 1};
  s = TakeSpanResult<float>(c, plan, task, bad).status();
  EXPECT_NE(s.message().find("backbone.layers.2.mixer.D"), std::string::npos) << s;
  bad = good;
  bad.emplace("backbone.layers.2.mixer.x_proj.weight", good.at("backbone.layers.2.mixer.D"));
  s = TakeSpanResult<float>(c, plan, task, bad).status();
  EXPECT_NE(s.message().find("x_proj"), std::string::npos) << s;
}

TEST(Mamba2SpanTest, ATaskOutOfOrderIsRefused) {
  const Mamba2Params<float> params = Init<float>(Config(), 5);
  const std::vector<uint32_t> tokens = Tokens(40, 40, 6);
  const SpanPlan plan = SpanPlan::Make(40, 10, 2, 3, 4).value();
  SpanLedger<float, Mamba2Params> ledger(params, plan, tokens, {});
  const std::unique_ptr<Backend<float>> backend = MakeBackend<float>(Device{}).value();
  const LayerModel<Mamba2Params<float>> model = MakeLayerModel(params, *backend).value();
  Mamba2SpanWork<float> w(model, plan, 0, ledger.SpanTokens(0), {}, ledger.n_targets(),
                          Storage::kCompute, "");
  Mamba2SpanOutputs<float> out;
  const absl::Status s = w.Run({SpanPhase::kBackward, 1, 0}, {}, out);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_FALSE(w.Run({SpanPhase::kForward, 0, 1}, {}, out).ok());  // another span's task
  EXPECT_FALSE(w.Run({SpanPhase::kForward, 1, 0}, {}, out).ok());  // layer 0 not run yet
}

}  // namespace
}  // namespace adjsh
