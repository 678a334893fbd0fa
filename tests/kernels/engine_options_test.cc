// The engine's optional gradient variants: the top-of-stack cotangent (the paper's Proposition
// 3, docs/MATH.md "The adjoint of the scan") and the loss mask (which next-token targets count,
// and the accuracy on them).
// tests/torch/test_top_of_stack.py checks the top-of-stack gradient against PyTorch autograd.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/adjoint_engine.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

using testing::MaxRelErr;

GradResult<double> Grad(const ModelParams<double>& p, const std::vector<uint32_t>& tokens,
                        GradOptions opt) {
  return ComputeGradient<double>(p, tokens, opt).value();
}

GradOptions TopOfStack(int threads = 2) {
  GradOptions opt;
  opt.chunk = 5;
  opt.threads = threads;
  opt.cotangent = Cotangent::kTopOfStack;
  return opt;
}

// With one layer the top-of-stack cotangent is the exact one: the gradients agree to f64
// rounding (the two run different schedules, wavefront against layer by layer).
TEST(TopOfStackTest, OneLayerIsExact) {
  const ModelParams<double> params = InitParams<double>(testing::SmallConfig(1), 3);
  const std::vector<uint32_t> tokens = testing::RandomTokens(23, 13, 5);
  GradOptions exact;
  exact.chunk = 5;
  exact.schedule = Schedule::kTwoPass;  // the forward top-of-stack runs: the same loss bits
  const GradResult<double> a = Grad(params, tokens, TopOfStack());
  const GradResult<double> b = Grad(params, tokens, exact);
  std::string worst;
  EXPECT_LT(MaxRelErr(a.grad, b.grad, &worst), 1e-12) << worst;
  EXPECT_EQ(a.loss, b.loss);
}

// With K layers the top layer still gets its exact cotangent, so its gradient and the head's
// are exact; every layer below (and the embedding, through dL/du^1) differs.
TEST(TopOfStackTest, OnlyTheTopLayerIsExactForSeveralLayers) {
  const ModelParams<double> params = InitParams<double>(testing::SmallConfig(3), 4);
  const std::vector<uint32_t> tokens = testing::RandomTokens(31, 13, 6);
  GradOptions exact;
  exact.chunk = 5;
  exact.schedule = Schedule::kTwoPass;  // the forward top-of-stack runs: the same loss bits
  const GradResult<double> a = Grad(params, tokens, TopOfStack());
  const GradResult<double> b = Grad(params, tokens, exact);
  EXPECT_EQ(a.loss, b.loss);  // forward unchanged
  EXPECT_LT(testing::RelErr(a.grad.norm_f, b.grad.norm_f), 1e-12);
  for (const auto& slot : LayerParamSlots<double>()) {
    EXPECT_LT(testing::RelErr(a.grad.layers[2].*slot.member, b.grad.layers[2].*slot.member), 1e-12)
        << slot.suffix;
  }
  for (int k = 0; k < 2; ++k) {
    EXPECT_GT(testing::RelErr(a.grad.layers[k].in_proj, b.grad.layers[k].in_proj), 1e-4) << k;
  }
  EXPECT_GT(testing::RelErr(a.grad.embed, b.grad.embed), 1e-6);
}

// Top-of-stack leaves out only the paths through the layers above: when those are the identity
// (out_proj = 0, so u^{k+1} = u^k and dL/du^k = dL/du^{k+1}), it is exact.
TEST(TopOfStackTest, IsExactWhenTheLayersAboveAreIdentities) {
  const ModelParams<double> params = InitParams<double>(testing::SmallConfig(2), 7);
  const std::vector<uint32_t> tokens = testing::RandomTokens(19, 13, 8);
  ModelParams<double> identity_top = params;
  for (double& w : identity_top.layers[1].out_proj) w = 0;
  GradOptions exact;
  exact.chunk = 5;
  exact.schedule = Schedule::kTwoPass;  // the forward top-of-stack runs: the same loss bits
  const GradResult<double> a = Grad(identity_top, tokens, TopOfStack());
  const GradResult<double> b = Grad(identity_top, tokens, exact);
  std::string worst;
  EXPECT_LT(MaxRelErr(a.grad, b.grad, &worst), 1e-12) << worst;
}

TEST(TopOfStackTest, DoesNotDependOnThreadsOrChunk) {
  const ModelParams<double> params = InitParams<double>(testing::SmallConfig(3), 9);
  const std::vector<uint32_t> tokens = testing::RandomTokens(29, 13, 10);
  const GradResult<double> a = Grad(params, tokens, TopOfStack(1));
  const GradResult<double> b = Grad(params, tokens, TopOfStack(3));
  EXPECT_TRUE(testing::BitwiseEqual(a.grad, b.grad));
  GradOptions other_chunk = TopOfStack();
  other_chunk.chunk = 29;
  EXPECT_LT(MaxRelErr(Grad(params, tokens, other_chunk).grad, a.grad), 1e-12);
}

TEST(TopOfStackTest, CommandLineNames) {
  EXPECT_EQ(CotangentFromName("exact").value(), Cotangent::kExact);
  EXPECT_EQ(CotangentFromName("top-of-stack").value(), Cotangent::kTopOfStack);
  EXPECT_FALSE(CotangentFromName("top").ok());
}

std::vector<uint8_t> Mask(int64_t T, const std::vector<int64_t>& counted) {
  std::vector<uint8_t> m(T, 0);
  for (int64_t t : counted) m[t] = 1;
  return m;
}

// All targets counted is the unmasked computation, bit for bit.
TEST(LossMaskTest, AllOnesIsBitwiseUnmasked) {
  const ModelParams<double> params = InitParams<double>(testing::SmallConfig(2), 11);
  const std::vector<uint32_t> tokens = testing::RandomTokens(37, 13, 12);
  const std::vector<uint8_t> ones(tokens.size(), 1);
  GradOptions plain, masked;
  masked.loss_mask = ones;
  const GradResult<double> a = Grad(params, tokens, plain);
  const GradResult<double> b = Grad(params, tokens, masked);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_TRUE(testing::BitwiseEqual(a.grad, b.grad));
  EXPECT_EQ(a.targets, 36);
  EXPECT_EQ(a.correct, -1);
  EXPECT_EQ(b.targets, 36);
  EXPECT_GE(b.correct, 0);
}

// The loss is the mean over the counted targets, so for a partition {A, B} of the targets,
// |A| g_A + |B| g_B = (T - 1) g (loss and gradient), to f64 rounding.
TEST(LossMaskTest, PartitionSumsToTheWholeLoss) {
  const ModelParams<double> params = InitParams<double>(testing::SmallConfig(2), 13);
  const int64_t T = 41;
  const std::vector<uint32_t> tokens = testing::RandomTokens(T, 13, 14);
  std::vector<int64_t> a_idx, b_idx;
  for (int64_t t = 1; t < T; ++t) (t % 3 == 0 ? a_idx : b_idx).push_back(t);
  const std::vector<uint8_t> ma = Mask(T, a_idx), mb = Mask(T, b_idx);
  GradOptions all, oa, ob;
  all.chunk = oa.chunk = ob.chunk = 8;
  oa.loss_mask = ma, ob.loss_mask = mb;
  const GradResult<double> g = Grad(params, tokens, all), ga = Grad(params, tokens, oa),
                           gb = Grad(params, tokens, ob);
  const double na = a_idx.size(), nb = b_idx.size();
  EXPECT_EQ(ga.targets, static_cast<int64_t>(a_idx.size()));
  EXPECT_NEAR(na * ga.loss + nb * gb.loss, (T - 1) * g.loss, 1e-11);
  ModelParams<double> sum = ZeroParams<double>(params.config);
  ModelParams<double> whole = ZeroParams<double>(params.config);
  auto combine = [&](std::vector<double>& out, const std::vector<double>& x,
                     const std::vector<double>& y, const std::vector<double>& z,
                     std::vector<double>& w) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = na * x[k] + nb * y[k], w[k] = (T - 1) * z[k];
  };
  combine(sum.embed, ga.grad.embed, gb.grad.embed, g.grad.embed, whole.embed);
  combine(sum.norm_f, ga.grad.norm_f, gb.grad.norm_f, g.grad.norm_f, whole.norm_f);
  for (size_t k = 0; k < sum.layers.size(); ++k)
    for (const auto& s : LayerParamSlots<double>())
      combine(sum.layers[k].*s.member, ga.grad.layers[k].*s.member, gb.grad.layers[k].*s.member,
              g.grad.layers[k].*s.member, whole.layers[k].*s.member);
  std::string worst;
  EXPECT_LT(MaxRelErr(sum, whole, &worst), 1e-12) << worst;
}

// A target counts as correct iff its logit is the largest. With only target t counted, the
// loss with token t replaced by v is logsumexp - logit_v (the logits at t do not depend on
// token t), so the argmax is the v of the smallest such loss: an independent check.
TEST(LossMaskTest, AccuracyIsTheArgmaxOfTheLogits) {
  const MambaConfig config = testing::SmallConfig(2);
  ModelParams<double> params = InitParams<double>(config, 15);
  for (double& e : params.embed) e *= 30;  // spread the logits
  const int64_t T = 17;
  std::vector<uint32_t> tokens = testing::RandomTokens(T, config.vocab_size, 16);
  for (int64_t t : {3, 8, 12, 16}) {
    const std::vector<uint8_t> m = Mask(T, {t});
    GradOptions opt;
    opt.loss_mask = m;
    uint32_t best = 0;
    double best_loss = INFINITY;
    for (uint32_t v = 0; v < config.vocab_size; ++v) {
      std::vector<uint32_t> alt = tokens;
      alt[t] = v;
      const double l = Grad(params, alt, opt).loss;
      if (l < best_loss) best_loss = l, best = v;
    }
    for (uint32_t v : {best, (best + 1) % static_cast<uint32_t>(config.vocab_size)}) {
      std::vector<uint32_t> alt = tokens;
      alt[t] = v;
      const GradResult<double> r = Grad(params, alt, opt);
      EXPECT_EQ(r.targets, 1);
      EXPECT_EQ(r.correct, v == best ? 1 : 0) << "t=" << t << " v=" << v;
    }
  }
}

TEST(LossMaskTest, RejectsWrongLengthAndNoTarget) {
  const ModelParams<double> params = InitParams<double>(testing::SmallConfig(1), 17);
  const std::vector<uint32_t> tokens = testing::RandomTokens(10, 13, 18);
  const std::vector<uint8_t> short_mask(9, 1), only_first = Mask(10, {0});
  GradOptions opt;
  opt.loss_mask = short_mask;
  EXPECT_EQ(ComputeGradient<double>(params, tokens, opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  opt.loss_mask = only_first;
  EXPECT_EQ(ComputeGradient<double>(params, tokens, opt).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adjsh
