// bench/flops.h's per-token GEMM counts against the GEMM flops a gradient really runs
// (kernels/cpu/blas.h GemmFlopsSoFar): the benchmarks' "executed GFLOP/s" and its ratio to the
// sgemm rate (docs/BENCHMARKS.md) are only as true as this count.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/flops.h"
#include "engine/adjoint_engine.h"
#include "engine/gradient_step.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/kept_pool.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

constexpr int64_t kT = 1000, kChunk = 100, kSpans = 5;  // 10 chunks, 2 per span

struct Case {
  std::string name;
  Schedule schedule;
  int64_t kept_budget;  // bytes
  int64_t chunk = kChunk;
};

// One gradient: the GEMM flops it ran, and the formula's count for its schedule with the kept
// and carried shares it reached (counted as bench/grad_bench.cc counts them).
void Check(const Case& c) {
  const MambaConfig config = testing::SmallConfig(2, 16, 8, 4, 2, 29);
  const ModelParams<float> params = InitParams<float>(config, 5);
  const std::vector<uint32_t> tokens = testing::RandomTokens(kT, config.vocab_size, 6);
  GradOptions opt;
  opt.chunk = c.chunk;
  opt.schedule = c.schedule;
  opt.spans = kSpans;
  opt.threads = 2;
  opt.device.kept_budget = c.kept_budget;  // the step's backend keeps in the store of it
  const std::shared_ptr<cpu::KeptStore> store = cpu::KeptStore::Shared(c.kept_budget);
  const cpu::KeptTakes was = store->takes();
  const int64_t flops_before = cpu::GemmFlopsSoFar();
  ASSERT_TRUE(ComputeGradient<float>(params, tokens, opt).ok());
  const double ran = double(cpu::GemmFlopsSoFar() - flops_before);
  const cpu::KeptTakes now = store->takes();

  const int64_t given = now.given - was.given + now.carried_to_summary - was.carried_to_summary;
  const int64_t refused = now.refused - was.refused;
  const double kept = given + refused > 0 ? double(given) / double(given + refused) : 0.0;
  // The wavefront's chunks at C = 256 are tapered (64 rows first, 104 last: not C each), so
  // the share carried is one of rows, as grad_bench counts it.
  const int64_t K = config.num_hidden_layers,
                chunks = c.schedule == Schedule::kWavefront
                             ? int64_t(GradientStep<float>::ChunkStarts(kT, c.chunk, true).size()) - 1
                             : kT / c.chunk;
  const double carried = double(now.carried_rows - was.carried_rows) / double(K * kT);
  // Pass one: all chunks (spans) but one each way, as bench/grad_bench.cc counts it.
  const double pass_one = c.schedule == Schedule::kTwoPass ? double(chunks - 1) / chunks
                          : c.schedule == Schedule::kSpans ? double(kSpans - 1) / kSpans
                                                           : 0.0;
  const double counted =
      bench::GradientFlopsPerToken(config, true, pass_one, kept, carried).executed * kT;
  // The formula counts T rows per product; every chunk but the first also runs in_proj's
  // products over its W - 1 halo rows: per layer, at most six products of in_proj's size per
  // chunk (the summaries' and the forward's, the VJP task's recompute, dW_in and dn).
  const double Di = double(config.inner()), D = double(config.hidden_size);
  const double halo = double(config.conv_kernel - 1) * double(chunks - 1) * double(K) * 6.0 *
                      (2.0 * D * 2.0 * Di);
  EXPECT_GE(ran, counted) << c.name << ": the formula counts flops the gradient did not run";
  EXPECT_LE(ran, counted + halo) << c.name << ": the gradient ran flops the formula missed";
  if (c.kept_budget > 0 && c.schedule == Schedule::kSpans) {
    EXPECT_GT(kept, 0.5) << c.name;
    EXPECT_GT(carried, 0.0) << c.name;
  }
  if (c.kept_budget > 0 && c.schedule == Schedule::kWavefront) {
    EXPECT_EQ(carried, 1.0) << c.name << ": every forward carried to its backward";
  }
}

TEST(GemmFlopsTest, FlopsHCountsWhatTheWavefrontRuns) {
  Check({"wavefront", Schedule::kWavefront, 0});
}

TEST(GemmFlopsTest, FlopsHCountsWhatTheWavefrontRunsWithSetsCarried) {
  Check({"wavefront, carried", Schedule::kWavefront, int64_t{256} << 20});
}

TEST(GemmFlopsTest, FlopsHCountsWhatTheWavefrontRunsWithTaperedChunksCarried) {
  Check({"wavefront, tapered, carried", Schedule::kWavefront, int64_t{256} << 20, 256});
}

TEST(GemmFlopsTest, FlopsHCountsWhatTheTwoPassScheduleRuns) {
  Check({"two-pass", Schedule::kTwoPass, 0});
}

TEST(GemmFlopsTest, FlopsHCountsWhatTheSpansRunWithNothingKept) {
  Check({"spans, none kept", Schedule::kSpans, 0});
}

TEST(GemmFlopsTest, FlopsHCountsWhatTheSpansRunWithSetsKeptAndCarried) {
  Check({"spans, kept and carried", Schedule::kSpans, int64_t{256} << 20});
}

}  // namespace
}  // namespace adjsh
