// The span schedule (engine/span_plan.h, span_work.h, span_ledger.h): its plan and checks, the
// fixed reduction tree, bitwise independence of threads, and the rebuild of a lost span from
// the ledger's summaries alone, bitwise.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>

#include "engine/adjoint_engine.h"
#include "engine/span_ledger.h"
#include "engine/span_plan.h"
#include "engine/span_work.h"
#include "kernels/cpu/kept_pool.h"
#include "kernels/cpu/mamba_block.h"
#include "kernels/mamba_chunk_ops.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

TEST(SpanPlanTest, SpansAreRunsOfWholeChunksCoveringTheSequence) {
  const SpanPlan p = SpanPlan::Make(1000, 64, 5, 2, 4).value();  // 16 chunks, the last 40 long
  ASSERT_EQ(p.spans(), 5);
  int64_t t = 0;
  for (int64_t s = 0; s < 5; ++s) {
    EXPECT_EQ(p.range(s).t0, t);
    EXPECT_EQ(p.range(s).t0, p.range(s).c0 * 64);
    EXPECT_EQ(p.range(s).halo, s == 0 ? 0 : 3);
    t += p.range(s).len;
  }
  EXPECT_EQ(t, 1000);
  // Four task kinds per layer: S - 1 summaries and S spans each way.
  EXPECT_EQ(p.num_tasks(), 2 * 2 * (4 + 5));
  for (int64_t id = 0; id < p.num_tasks(); ++id)
    for (int64_t d : p.Dependencies(id)) EXPECT_LT(d, id);
}

TEST(SpanPlanTest, RefusesSpansTheChunksCannotMake) {
  EXPECT_FALSE(SpanPlan::Make(100, 10, 11, 1, 4).ok());  // 10 chunks
  // Chunks of 1 token: a middle span of 2 tokens cannot give the next one its 3 halo rows.
  const absl::StatusOr<SpanPlan> p = SpanPlan::Make(8, 1, 4, 1, 4);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("W - 1"), std::string::npos) << p.status();
  EXPECT_TRUE(SpanPlan::Make(8, 1, 2, 1, 4).ok());
}

TEST(SpanPlanTest, DefaultSpansGrowWithTAndStayValid) {
  EXPECT_EQ(SpanPlan::DefaultSpans(65536, 1024, 4), 8);
  EXPECT_EQ(SpanPlan::DefaultSpans(1 << 20, 4096, 4), 64);
  EXPECT_EQ(SpanPlan::DefaultSpans(100, 256, 4), 1);  // one chunk
  for (int64_t T : {2, 5, 9, 100, 1000})
    for (int64_t C : {1, 2, 3, 7})
      EXPECT_TRUE(SpanPlan::Make(T, C, 0, 2, 4).ok()) << T << " " << C;
}

// Leaves in any arrival order give the bits of the one tree: left + right at every node.
TEST(FixedTreeSumTest, ArrivalOrderDoesNotChangeTheSum) {
  const std::vector<float> leaves = {1.0f, 1e8f, -1e8f, 0.5f, 3.25f, 1e-3f, -7.0f};
  auto run = [&](std::vector<int64_t> order) {
    FixedTreeSum<float> t(7, [](float& a, const float& b) { a += b; });
    for (int64_t i : order) t.Add(i, leaves[i]);
    EXPECT_TRUE(t.Complete());
    return t.TakeRoot();
  };
  const float in_order = run({0, 1, 2, 3, 4, 5, 6});
  std::mt19937 rng(3);
  std::vector<int64_t> order = {0, 1, 2, 3, 4, 5, 6};
  for (int rep = 0; rep < 20; ++rep) {
    std::shuffle(order.begin(), order.end(), rng);
    const float got = run(order);
    EXPECT_EQ(std::memcmp(&got, &in_order, sizeof(float)), 0);
  }
  // 1 + (1e8 - 1e8) at the first node, not (1 + 1e8) - 1e8: the tree is really used.
  float left = 0;
  for (float v : leaves) left += v;
  EXPECT_NE(left, in_order);
}

template <typename T>
void ExpectSameRun(const GradResult<T>& a, const GradResult<T>& b) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0);
  EXPECT_TRUE(testing::BitwiseEqual(a.grad, b.grad));
}

TEST(SpanScheduleTest, ThreadsDoNotChangeTheBits) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<float> params = InitParams<float>(config, 11);
  const std::vector<uint32_t> tokens = testing::RandomTokens(700, config.vocab_size, 12);
  for (Storage storage : {Storage::kCompute, Storage::kBF16})
    for (int64_t spans : {1, 3, 7}) {
      GradOptions opt;
      opt.chunk = 50;
      opt.spans = spans;
      opt.storage = storage;
      opt.threads = 1;
      const GradResult<float> one = ComputeGradient<float>(params, tokens, opt).value();
      for (int threads : {2, 3, 5}) {
        opt.threads = threads;
        ExpectSameRun(one, ComputeGradient<float>(params, tokens, opt).value());
      }
    }
}

// The activations a span's summaries keep for the pass after them (kernels/cpu/kept_pool.h),
// and those its forward carries on to the layer's backward, change no bit: every set kept, some
// (a budget of a few sets), or none.
TEST(SpanScheduleTest, KeptActivationsDoNotChangeTheBits) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<float> params = InitParams<float>(config, 11);
  const std::vector<uint32_t> tokens = testing::RandomTokens(700, config.vocab_size, 12);
  for (Storage storage : {Storage::kCompute, Storage::kBF16})
    for (int64_t spans : {3, 7}) {
      GradOptions opt;
      opt.chunk = 50;
      opt.spans = spans;
      opt.storage = storage;
      opt.threads = 2;
      opt.device.kept_budget = 0;  // its backend's store: the process's of budget 0
      const std::shared_ptr<cpu::KeptStore> zero = cpu::KeptStore::Shared(0);
      const int64_t given = zero->takes().given;
      const GradResult<float> none = ComputeGradient<float>(params, tokens, opt).value();
      EXPECT_EQ(zero->takes().given, given);
      for (int64_t budget : {int64_t{160} << 10, int64_t{256} << 20}) {
        opt.device.kept_budget = budget;
        const std::shared_ptr<cpu::KeptStore> store = cpu::KeptStore::Shared(budget);
        const cpu::KeptTakes was = store->takes();
        ExpectSameRun(none, ComputeGradient<float>(params, tokens, opt).value());
        const cpu::KeptTakes now = store->takes();
        EXPECT_GT(now.given, was.given) << "nothing was kept";
        if (budget < (int64_t{1} << 20)) {
          EXPECT_GT(now.refused, was.refused) << "all was kept";
        } else {  // forward sets carried on to AdjointSummary, and in span 0 to the VJP task
          EXPECT_GT(now.carried_to_summary, was.carried_to_summary);
          EXPECT_GT(now.carried_to_backward, was.carried_to_backward);
          // Every chunk of every layer, the last span's too (it runs no forward summary: its
          // forward recomputes into fresh sets to carry).
          EXPECT_EQ(now.carried_to_summary - was.carried_to_summary + now.carried_to_backward -
                        was.carried_to_backward,
                    config.num_hidden_layers * 14);  // 700 tokens in chunks of 50
        }
        EXPECT_EQ(store->carried_bytes(), 0) << "a carried set outlived its step";
        opt.forward_only = true;  // the forward's sets alone
        const GradResult<float> fwd = ComputeGradient<float>(params, tokens, opt).value();
        EXPECT_EQ(std::memcmp(&fwd.loss, &none.loss, sizeof(double)), 0);
        opt.forward_only = false;
      }
    }
}

// Once the budget refuses a summary a set, the step runs a ready forward or VJP task before a
// ready summary (engine/span_step.cc), so each span's sets go back before the next span's
// summary asks: on one thread, a budget of three chunks' sets keeps the sets of 3 in 4
// summarised chunks, where taking the summaries as they became ready kept 1 in 4 (each
// layer's summaries of all spans ran first). The bits are the same either way.
TEST(SpanScheduleTest, ATightBudgetRunsTheTasksThatHandSetsBackFirst) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<float> params = InitParams<float>(config, 11);
  const std::vector<uint32_t> tokens = testing::RandomTokens(700, config.vocab_size, 12);
  GradOptions opt;
  opt.chunk = 50;
  opt.spans = 7;  // 2 chunks each
  opt.threads = 1;
  opt.device.kept_budget = 0;
  const GradResult<float> none = ComputeGradient<float>(params, tokens, opt).value();
  const cpu::MambaBlockCpu<float> block(config, params.layers[0]);
  opt.device.kept_budget = 3 * block.SetBytes({3, 50, 0});
  // The step's backend says what its store refused (engine/span_step.cc orders by it): the
  // store of that budget, which this backend shares.
  const std::unique_ptr<Backend<float>> backend = MakeBackend<float>(opt.device).value();
  const std::shared_ptr<cpu::KeptStore> store = cpu::KeptStore::Shared(opt.device.kept_budget);
  const cpu::KeptTakes was = store->takes();
  EXPECT_EQ(backend->KeptRefusals(), was.refused);
  ExpectSameRun(none, ComputeGradient<float>(params, tokens, opt).value());
  const cpu::KeptTakes now = store->takes();
  EXPECT_EQ(backend->KeptRefusals(), now.refused);
  const int64_t given = now.given - was.given, refused = now.refused - was.refused;
  EXPECT_GT(refused, 0) << "the budget was not tight";
  EXPECT_GE(given, 2 * refused) << given << " kept, " << refused << " refused";
}

// Backends of different kept budgets keep in different stores: a step on one counts nothing in
// the other's, and each backend reads its own refusals (what the span step orders tasks by).
TEST(SpanScheduleTest, BackendsOfDifferentBudgetsShareNoKeptCounts) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<float> params = InitParams<float>(config, 11);
  const std::vector<uint32_t> tokens = testing::RandomTokens(700, config.vocab_size, 12);
  const cpu::MambaBlockCpu<float> block(config, params.layers[0]);
  GradOptions opt;
  opt.chunk = 50;
  opt.spans = 7;
  opt.threads = 1;
  Device tight, other;
  tight.kept_budget = 2 * block.SetBytes({3, 50, 0}) + 1;  // budgets of no other test
  other.kept_budget = 5 * block.SetBytes({3, 50, 0}) + 1;
  const std::unique_ptr<Backend<float>> a = MakeBackend<float>(tight).value();
  const std::unique_ptr<Backend<float>> b = MakeBackend<float>(other).value();
  const std::shared_ptr<cpu::KeptStore> sa = cpu::KeptStore::Shared(tight.kept_budget),
                                        sb = cpu::KeptStore::Shared(other.kept_budget);
  const cpu::KeptTakes b_was = sb->takes();
  const int64_t b_refused = b->KeptRefusals();
  opt.device = tight;
  ASSERT_TRUE(ComputeGradient<float>(params, tokens, opt).ok());
  EXPECT_GT(a->KeptRefusals(), 0) << "the tight budget refused nothing";
  EXPECT_GT(sa->takes().given, 0);
  const cpu::KeptTakes b_now = sb->takes();
  EXPECT_EQ(b->KeptRefusals(), b_refused);
  EXPECT_EQ(b_now.given, b_was.given);
  EXPECT_EQ(b_now.refused, b_was.refused);
  EXPECT_EQ(b_now.carried_rows, b_was.carried_rows);
  EXPECT_EQ(sb->bytes(), 0);  // none of the tight run's sets went to the other store
  EXPECT_GT(sa->bytes(), 0);  // the tight run's handed-back sets wait in its own
}

// A forward-only step (evaluation) is the full step's forward: its loss, targets and correct
// count are the full step's bit for bit, for every span count, with no gradient and no backward
// task; its plan's tasks keep their full-plan ids.
TEST(SpanScheduleTest, ForwardOnlyGivesTheFullStepsLossBitwise) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<float> params = InitParams<float>(config, 11);
  const std::vector<uint32_t> tokens = testing::RandomTokens(700, config.vocab_size, 12);
  const std::vector<uint8_t> mask = testing::EveryThirdLeftOut(tokens.size());
  for (bool masked : {false, true})
    for (int64_t spans : {1, 3, 7}) {
      GradOptions opt;
      opt.chunk = 50;
      opt.spans = spans;
      opt.threads = 2;
      if (masked) opt.loss_mask = mask;
      const GradResult<float> full = ComputeGradient<float>(params, tokens, opt).value();
      opt.forward_only = true;
      const GradResult<float> fwd = ComputeGradient<float>(params, tokens, opt).value();
      EXPECT_EQ(std::memcmp(&fwd.loss, &full.loss, sizeof(double)), 0)
          << "spans " << spans << ": " << fwd.loss << " vs " << full.loss;
      EXPECT_EQ(fwd.targets, full.targets);
      EXPECT_EQ(fwd.correct, full.correct);
      EXPECT_TRUE(fwd.grad.layers.empty());
      EXPECT_TRUE(fwd.grad.embed.empty());
      const SpanPlan all = SpanPlan::Make(700, 50, spans, 3, config.conv_kernel).value();
      const SpanPlan f = SpanPlan::Make(700, 50, spans, 3, config.conv_kernel, true).value();
      EXPECT_TRUE(f.forward_only());
      EXPECT_EQ(f.num_tasks(), 3 * (2 * spans - 1));
      for (int64_t id = 0; id < f.num_tasks(); ++id) {
        const SpanTask& t = f.task(id);
        EXPECT_NE(t.phase, SpanPhase::kBackward);
        EXPECT_NE(t.phase, SpanPhase::kBackwardSummary);
        EXPECT_EQ(all.Id(t.phase, t.layer, t.span), id);
        EXPECT_EQ(f.Dependencies(id), all.Dependencies(id));
      }
      EXPECT_EQ(f.Id(SpanPhase::kBackward, 0, 0), -1);
    }
  GradOptions wavefront;
  wavefront.schedule = Schedule::kWavefront;
  wavefront.forward_only = true;
  EXPECT_EQ(ComputeGradient<float>(params, tokens, wavefront).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A span lost at any task is rebuilt by a fresh SpanWork replaying the ledger's inputs, and the
// step ends bitwise as the undisturbed one.
TEST(SpanScheduleTest, ARebuiltSpanGivesTheSameBits) {
  const MambaConfig config = testing::SmallConfig(3, 16, 8, 4, 3, 31);
  const ModelParams<float> params = InitParams<float>(config, 5);
  const std::vector<uint32_t> tokens = testing::RandomTokens(333, config.vocab_size, 6);
  const SpanPlan plan = SpanPlan::Make(333, 20, 4, 3, config.conv_kernel).value();
  std::unique_ptr<Backend<float>> backend = MakeBackend<float>(Device{}).value();
  const LayerModel<ModelParams<float>> model = MakeLayerModel(params, *backend);
  auto run = [&](int64_t lose_at) {  // -1: nothing lost
    SpanLedger<float> ledger(params, plan, tokens, {});
    std::vector<std::unique_ptr<SpanWork<float>>> work(plan.spans());
    auto fresh = [&](int64_t s) {
      return std::make_unique<SpanWork<float>>(model, plan, s, ledger.SpanTokens(s),
                                               ledger.SpanMask(s), ledger.n_targets(),
                                               Storage::kCompute, "");
    };
    int64_t rebuilt = 0;
    for (int64_t id = 0; id < plan.num_tasks(); ++id) {  // ids are a topological order
      const SpanTask& task = plan.task(id);
      if (id == lose_at) work[task.span].reset();
      if (!work[task.span] || !work[task.span]->Ready(task)) {
        work[task.span] = fresh(task.span);
        for (const auto& [step, in] : ledger.Replay(id)) {
          SpanOutputs<float> discard;
          EXPECT_TRUE(work[task.span]->Run(step, in, discard).ok());
        }
        rebuilt += id == lose_at;
      }
      SpanOutputs<float> out;
      EXPECT_TRUE(work[task.span]->Run(task, ledger.Inputs(id), out).ok());
      ledger.Apply(id, std::move(out));
    }
    if (lose_at >= 0) {
      EXPECT_EQ(rebuilt, 1);
    }
    return ledger.Finish();
  };
  const GradResult<float> undisturbed = run(-1);
  GradOptions opt;
  opt.chunk = 20;
  opt.spans = 4;
  ExpectSameRun(undisturbed, ComputeGradient<float>(params, tokens, opt).value());
  for (int64_t lose_at = 0; lose_at < plan.num_tasks(); lose_at += 3) {
    SCOPED_TRACE(lose_at);
    ExpectSameRun(undisturbed, run(lose_at));
  }
}

// A task the kept values do not serve is refused, not computed from the wrong rows.
TEST(SpanScheduleTest, ATaskOutOfOrderIsRefused) {
  const MambaConfig config = testing::SmallConfig(2);
  const ModelParams<float> params = InitParams<float>(config, 5);
  const std::vector<uint32_t> tokens = testing::RandomTokens(40, config.vocab_size, 6);
  const SpanPlan plan = SpanPlan::Make(40, 10, 2, 2, config.conv_kernel).value();
  std::unique_ptr<Backend<float>> backend = MakeBackend<float>(Device{}).value();
  const LayerModel<ModelParams<float>> model = MakeLayerModel(params, *backend);
  SpanLedger<float> ledger(params, plan, tokens, {});
  SpanWork<float> w(model, plan, 0, ledger.SpanTokens(0), {}, ledger.n_targets(),
                    Storage::kCompute, "");
  SpanOutputs<float> out;
  const absl::Status s = w.Run({SpanPhase::kBackward, 1, 0}, {}, out);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_FALSE(w.Run({SpanPhase::kForward, 0, 1}, {}, out).ok());  // another span's task
}

}  // namespace
}  // namespace adjsh
