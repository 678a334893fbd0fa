// The device choice on any machine: parsing --device values, unsupported operations refused
// with a clear status (never attempted), and the CPU backend equal bitwise to the CPU kernels
// it wraps, so that `--device cpu` (the default) computes exactly what it did before backends.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/adjoint_engine.h"
#include "kernels/backend.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/lm_head.h"
#include "kernels/cpu/mamba_block.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

std::vector<float> RandomVector(int64_t n, uint64_t seed, float scale = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(ParseDeviceTest, AcceptsCpuAndCudaOrdinals) {
  absl::StatusOr<Device> d = ParseDevice("cpu");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->is_cpu());
  EXPECT_EQ(d->ToString(), "cpu");
  d = ParseDevice("cuda");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kind, Device::Kind::kCuda);
  EXPECT_EQ(d->index, 0);
  d = ParseDevice("cuda:7");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 7);
  EXPECT_EQ(d->ToString(), "cuda:7");
  d = ParseDevice("cuda:1023");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 1023);
}

TEST(ParseDeviceTest, RejectsMalformedValuesNamingThem) {
  for (const char* bad : {"", "gpu", "CPU", "cuda:", "cuda:-1", "cuda:01", "cuda:x", "cuda:1024",
                          "cuda:0:1", "cuda0", " cuda:0"}) {
    absl::StatusOr<Device> d = ParseDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(d.status().message()).find(std::string("'") + bad + "'"),
              std::string::npos)
        << d.status();
  }
}

TEST(ParseDeviceTest, Bf16StorageIsNamed) {
  Device d = ParseDevice("cuda:1").value();
  d.bf16_storage = true;
  EXPECT_EQ(d.ToString(), "cuda:1 (bf16 storage)");
}

TEST(BackendTest, UnsupportedCombinationsAreRefusedWithAClearStatus) {
  Device bf16_cpu;
  bf16_cpu.bf16_storage = true;
  absl::StatusOr<std::unique_ptr<Backend<float>>> b = MakeBackend<float>(bf16_cpu);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(b.status().message()).find("bf16"), std::string::npos);

  const Device cuda = *ParseDevice("cuda:0");
  absl::StatusOr<std::unique_ptr<Backend<double>>> f64 = MakeBackend<double>(cuda);
  ASSERT_FALSE(f64.ok());
  EXPECT_EQ(f64.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(f64.status().message())
                .find(CudaBuilt() ? "f64 is not supported on cuda:0" : "without CUDA"),
            std::string::npos)
      << f64.status();

  // No machine has 1024 GPUs: refused either way, never a crash.
  absl::StatusOr<std::unique_ptr<Backend<float>>> far =
      MakeBackend<float>(*ParseDevice("cuda:1023"));
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().code(), CudaBuilt() ? absl::StatusCode::kFailedPrecondition
                                             : absl::StatusCode::kUnimplemented)
      << far.status();
  EXPECT_NE(std::string(far.status().message()).find("cuda:1023"), std::string::npos);
}

TEST(BackendTest, TheEngineRefusesWhatTheDeviceCannotDo) {
  const MambaConfig config = testing::SmallConfig(1);
  const ModelParams<double> p64 = InitParams<double>(config, 1);
  const ModelParams<float> p32 = InitParams<float>(config, 1);
  const std::vector<uint32_t> tokens = testing::RandomTokens(20, config.vocab_size, 2);
  GradOptions opt;
  opt.device = *ParseDevice("cuda:0");
  opt.chunk = 8;
  absl::StatusOr<GradResult<double>> g64 = ComputeGradient<double>(p64, tokens, opt);
  ASSERT_FALSE(g64.ok());
  EXPECT_EQ(g64.status().code(), absl::StatusCode::kUnimplemented);
  const std::vector<uint8_t> mask(tokens.size(), 1);
  for (int variant = 0; variant < 2; ++variant) {
    GradOptions o = opt;
    if (variant == 0) o.window = 4;
    if (variant == 1) o.spans = 2, o.loss_mask = mask;
    absl::StatusOr<GradResult<float>> g = ComputeGradient<float>(p32, tokens, o);
    ASSERT_FALSE(g.ok());
    // Without CUDA (or without a GPU) the device itself is refused; with one, the op is.
    const std::string msg(g.status().message());
    if (g.status().code() == absl::StatusCode::kUnimplemented && CudaBuilt() &&
        msg.find("not supported on cuda:0") != std::string::npos) {
      const char* what[] = {"truncated", "--loss-mask"};
      EXPECT_NE(msg.find(what[variant]), std::string::npos) << msg;
    } else {
      EXPECT_TRUE(g.status().code() == absl::StatusCode::kFailedPrecondition ||
                  g.status().code() == absl::StatusCode::kUnimplemented)
          << g.status();
    }
  }
}

// What CUDA lacks is refused by name, known without a GPU: the truncated window, and the
// head's greedy count (a masked run would else optimise the whole-sequence loss). It has the
// span schedule's summaries.
TEST(BackendTest, CudaRefusesTheWindowAndTheMaskedHead) {
  if (!CudaBuilt()) GTEST_SKIP() << "a build without CUDA";
  for (Op op : {Op::kForward, Op::kLocalSummary, Op::kAdjointSummary, Op::kBackwardExact,
                Op::kHead})
    EXPECT_TRUE(KindSupports(Device::Kind::kCuda, op)) << OpName(op);
  for (Op op : {Op::kBackwardTruncated, Op::kHeadAccuracy})
    EXPECT_FALSE(KindSupports(Device::Kind::kCuda, op)) << OpName(op);
  for (Op op : {Op::kLocalSummary, Op::kHeadAccuracy, Op::kBackwardTruncated})
    EXPECT_TRUE(KindSupports(Device::Kind::kCpu, op)) << OpName(op);
}

// The CPU backend's block is the CPU kernel: the same bits for the forward and the backward
// (halo rows, an incoming adjoint, accumulated gradients).
TEST(BackendTest, CpuBackendBlockIsBitwiseTheCpuKernel) {
  const MambaConfig config = testing::SmallConfig(1, 16, 8, 4, 3, 29);
  const ModelParams<float> params = InitParams<float>(config, 5);
  const LayerParams<float>& layer = params.layers[0];
  absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(Device{});
  ASSERT_TRUE(backend.ok());
  EXPECT_TRUE((*backend)->Supports(Op::kBackwardTruncated));
  std::unique_ptr<BlockBackend<float>> block = (*backend)->MakeBlock(config, layer);
  const cpu::MambaBlockCpu<float> direct(config, layer);
  const int64_t D = config.hidden_size, DiN = config.inner() * config.state_size;
  const cpu::ChunkRows rows{3, 21, 0};
  const std::vector<float> u = RandomVector((rows.halo + rows.len) * D, 1);
  const std::vector<float> h0 = RandomVector(DiN, 2, 0.1f), mu = RandomVector(DiN, 3, 0.1f);
  const std::vector<float> g = RandomVector(rows.len * D, 4, 0.01f);

  std::vector<float> y1(rows.len * D), y2(rows.len * D), e1(DiN), e2(DiN);
  block->Forward(u.data(), rows, h0.data(), y1.data(), e1.data());
  direct.Forward(u.data(), rows, h0.data(), y2.data(), e2.data());
  EXPECT_EQ(y1, y2);
  EXPECT_EQ(e1, e2);

  LayerParams<float> g1 = ZeroLayer<float>(config), g2 = ZeroLayer<float>(config);
  std::vector<float> du1(rows.len * D), du2(rows.len * D), dh1(rows.halo * D),
      dh2(rows.halo * D), m1(DiN), m2(DiN);
  for (int rep = 0; rep < 2; ++rep) {  // twice: the gradient accumulates
    block->Backward(u.data(), rows, g.data(), h0.data(), mu.data(), 0, g1, du1.data(),
                    dh1.data(), m1.data());
    direct.Backward(u.data(), rows, g.data(), h0.data(), mu.data(), 0, g2, du2.data(),
                    dh2.data(), m2.data());
  }
  EXPECT_EQ(du1, du2);
  EXPECT_EQ(dh1, dh2);
  EXPECT_EQ(m1, m2);
  for (const auto& slot : LayerParamSlots<float>()) EXPECT_EQ(g1.*slot.member, g2.*slot.member);
}

// The CPU backend's head over many rows is the head kernel over blocks of 64 rows, dE added
// block by block in row order (what the engine does).
TEST(BackendTest, CpuBackendHeadIsTheBlockedCpuHead) {
  const int64_t M = 150, D = 16, V = 29;
  const std::vector<float> E = RandomVector(V * D, 6, 0.1f), w = RandomVector(D, 7);
  const std::vector<float> u = RandomVector(M * D, 8);
  std::vector<int64_t> targets(M);
  for (int64_t t = 0; t < M; ++t) targets[t] = t + 1 < M ? (t * 7) % V : -1;
  const cpu::LmHeadArgs<float> args{M, D, V, 1e-5, E.data(), w.data(), u.data(), targets.data(),
                                    1.0f / (M - 1)};
  absl::StatusOr<std::unique_ptr<Backend<float>>> backend = MakeBackend<float>(Device{});
  ASSERT_TRUE(backend.ok());
  std::vector<float> du(M * D), dE(V * D, 0.5f), dw(D, 0.25f);
  const double loss = (*backend)->HeadForwardBackward(args, du.data(), dE.data(), dw.data());

  std::vector<float> du2(M * D), dE2(V * D, 0.5f), dw2(D, 0.25f);
  double loss2 = 0;
  for (int64_t r0 = 0; r0 < M; r0 += 64) {
    cpu::LmHeadArgs<float> b = args;
    b.M = std::min<int64_t>(64, M - r0), b.u = u.data() + r0 * D, b.targets = targets.data() + r0;
    std::vector<float> dlogits(b.M * V), nf(b.M * D), dwb(D, 0.0f);
    loss2 += cpu::LmHeadForwardBackward<float>(b, du2.data() + r0 * D, dlogits.data(), nf.data(),
                                              dwb.data());
    cpu::Gemm<float>(cpu::Trans::kYes, cpu::Trans::kNo, V, D, b.M, 1, dlogits.data(), V,
                     nf.data(), D, 1, dE2.data(), D);
    for (int64_t d = 0; d < D; ++d) dw2[d] += dwb[d];
  }
  EXPECT_EQ(loss, loss2);
  EXPECT_EQ(du, du2);
  EXPECT_EQ(dE, dE2);
  EXPECT_EQ(dw, dw2);
}

// Naming the CPU explicitly is the default path: the same bits.
TEST(BackendTest, ExplicitCpuDeviceIsTheDefaultPath) {
  const MambaConfig config = testing::SmallConfig(2);
  const ModelParams<float> params = InitParams<float>(config, 9);
  const std::vector<uint32_t> tokens = testing::RandomTokens(77, config.vocab_size, 3);
  GradOptions plain;
  plain.chunk = 16;
  GradOptions named = plain;
  named.device = *ParseDevice("cpu");
  absl::StatusOr<GradResult<float>> a = ComputeGradient<float>(params, tokens, plain);
  absl::StatusOr<GradResult<float>> b = ComputeGradient<float>(params, tokens, named);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->loss, b->loss);
  EXPECT_TRUE(testing::BitwiseEqual(a->grad, b->grad));
}

}  // namespace
}  // namespace adjsh
