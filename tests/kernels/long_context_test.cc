// T = 8,389,001 tokens (just past 2^23 = 8,388,608) through every path of the engine, checked
// against an independent prediction that an index overflow (32-bit offsets, T x V or T x D
// products with V = 256) or a lost or repeated chunk would break.
//
// The prediction: the token sequence repeats with period P, and the model forgets within a few
// dozen tokens (Delta ~ 1, A = -1: exp(Delta A) ~ e^-1 per token; the conv window is W = 4), so
// in a sequence of T = n P + 1 tokens every token's loss term and every per-token VJP is, up to
// e^-P, a function of its phase only, except for the same few dozen tokens at the start (zero
// state) and at the end (zero adjoint) for every n. Summed loss and summed gradient are therefore
// affine in n:  S(n) = S(2) + (n - 2) (S(3) - S(2)),  from two short runs of 2P + 1 and 3P + 1
// tokens through the same path. The long runs are in f64 so that the prediction holds to
// ~1e-10 relative, while one misplaced token out of 8M changes a sum by ~1e-7 relative.
// Paths: the span schedule workers run (K = 2, one span per chunk), two-pass and
// windowed (truncated adjoint) in f64, the f32 wavefront with the layer inputs in memory-mapped
// spill files (1e-3: f32 sums of 8M terms), the LM head inside each (the loss, the tied
// embedding's gradient), and token files (.u16, .u32) of 8M ids. Memory at the peak ~1 GiB (K T D f64 layer inputs, T D top rows, T D second buffer).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/model.h"
#include "common/tokens.h"
#include "engine/adjoint_engine.h"
#include "tests/kernels/backward_task.h"
#include "engine/gradient_step.h"
#include "gtest/gtest.h"
#include "kernels/cpu/mamba_block.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

constexpr int64_t kPeriod = 1000;                     // P
constexpr int64_t kPeriods = 8389;                    // n of the long run
constexpr int64_t kLongT = kPeriods * kPeriod + 1;    // 8,389,001 > 2^23
// 257 chunks, the last one partial; the exact wavefront's 258 start with 8K tokens and end with
// 24,960 and 8,201 (engine/gradient_step.h ChunkStarts).
constexpr int64_t kChunk = 32768;
constexpr int64_t kWindow = 600;                      // windowed path: Wt < P
static_assert(kLongT > (int64_t{1} << 23));

// D=4, N=2, W=4, R=1, V=256 (T V = 2^31 at T = 2^23: any 32-bit T x V offset overflows).
MambaConfig TinyConfig(int64_t layers) {
  return testing::SmallConfig(layers, /*D=*/4, /*N=*/2, /*W=*/4, /*R=*/1, /*V=*/256);
}

// A model that forgets quickly: A = -1 and Delta = softplus(~0.55 + small) ~ 1 per token.
template <typename T>
ModelParams<T> ForgetfulModel(int64_t layers) {
  ModelParams<T> p = InitParams<T>(TinyConfig(layers), 7);
  for (LayerParams<T>& l : p.layers) {
    for (T& a : l.A_log) a = 0;
    for (T& b : l.dt_b) b = static_cast<T>(0.55);
  }
  return p;
}

std::vector<uint32_t> PeriodicTokens(int64_t T) {
  std::mt19937_64 rng(42);
  std::vector<uint32_t> period(kPeriod);
  for (uint32_t& t : period) t = static_cast<uint32_t>(rng() % 256);
  std::vector<uint32_t> out(T);
  for (int64_t t = 0; t < T; ++t) out[t] = period[t % kPeriod];
  return out;
}

// Sum over targets (not mean) of a result: loss * (T - 1) and every gradient tensor likewise.
template <typename T>
struct Summed {
  double loss = 0;
  ModelParams<double> grad;
};

template <typename T>
Summed<T> ToSums(const GradResult<T>& r, int64_t T_len) {
  Summed<T> s;
  const double targets = static_cast<double>(T_len - 1);
  s.loss = r.loss * targets;
  s.grad = ZeroParams<double>(r.grad.config);
  ModelParams<T> src = r.grad;
  const std::vector<ParamRef<double>> dst = ListParams(s.grad);
  const std::vector<ParamRef<T>> from = ListParams(src);
  for (size_t k = 0; k < dst.size(); ++k)
    for (size_t i = 0; i < from[k].values->size(); ++i)
      (*dst[k].values)[i] = static_cast<double>((*from[k].values)[i]) * targets;
  return s;
}

struct Prediction {
  double loss = 0;
  ModelParams<double> grad;  // of the mean loss, like GradResult
};

// S(n) = S(2) + (n - 2) (S(3) - S(2)), then divided by the n P targets.
template <typename T>
Prediction Predict(int64_t layers, const GradOptions& options) {
  const ModelParams<T> params = ForgetfulModel<T>(layers);
  Summed<T> s[2];
  for (int k = 0; k < 2; ++k) {
    const int64_t T_len = (2 + k) * kPeriod + 1;
    const std::vector<uint32_t> tokens = PeriodicTokens(T_len);
    absl::StatusOr<GradResult<T>> r = ComputeGradient<T>(params, tokens, options);
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return Prediction{};
    }
    s[k] = ToSums(*r, T_len);
  }
  const double n = static_cast<double>(kPeriods), targets = static_cast<double>(kLongT - 1);
  Prediction p;
  p.loss = (s[0].loss + (n - 2) * (s[1].loss - s[0].loss)) / targets;
  p.grad = ZeroParams<double>(params.config);
  const std::vector<ParamRef<double>> a = ListParams(s[0].grad), b = ListParams(s[1].grad),
                                      dst = ListParams(p.grad);
  for (size_t k = 0; k < dst.size(); ++k) {
    for (size_t i = 0; i < dst[k].values->size(); ++i) {
      const double x = (*a[k].values)[i], y = (*b[k].values)[i];
      (*dst[k].values)[i] = (x + (n - 2) * (y - x)) / targets;
    }
  }
  return p;
}

// The long sequence, read back from an 8M-token .u32 file (token reading at far offsets).
const std::vector<uint32_t>& LongTokens() {
  static const std::vector<uint32_t> tokens = [] {
    const std::vector<uint32_t> made = PeriodicTokens(kLongT);
    const std::string path = (std::filesystem::path(::testing::TempDir()) /
                              ("adjsh_long_" + std::to_string(::getpid()) + ".u32"))
                                 .string();
    EXPECT_TRUE(WriteTokenFile(path, made).ok());
    absl::StatusOr<std::vector<uint32_t>> read = ReadTokenFile(path);
    std::filesystem::remove(path);
    EXPECT_TRUE(read.ok()) << read.status();
    return read.ok() ? *read : made;
  }();
  return tokens;
}

template <typename T>
void ExpectMatches(const GradResult<T>& got, const Prediction& want, double tol) {
  EXPECT_NEAR(got.loss, want.loss, tol * std::abs(want.loss));
  std::string worst;
  const double err = testing::MaxRelErr(got.grad, want.grad, &worst);
  EXPECT_LT(err, tol) << "worst tensor " << worst;
  std::printf("  loss %.12f (predicted %.12f), largest gradient error %.2e (%s)\n", got.loss,
              want.loss, err, worst.c_str());
}

GradOptions Options(Schedule schedule, int64_t window = 0) {
  GradOptions o;
  o.chunk = kChunk;
  o.schedule = schedule;
  o.window = window;
  o.threads = 2;
  return o;
}

// f64 prediction error: rounding of sums of ~1e7 terms plus (n - 2) x the short runs' rounding,
// measured ~5e-13; 1e-9 leaves 1000x room and is still 100x below one token's share of a sum
// (1 / 8.4M = 1.2e-7).
constexpr double kTolF64 = 1e-9;

TEST(LongContext, TokenFilesHold8MIdsAtFarOffsets) {
  const std::vector<uint32_t>& tokens = LongTokens();
  ASSERT_EQ(static_cast<int64_t>(tokens.size()), kLongT);
  const std::vector<uint32_t> want = PeriodicTokens(kLongT);
  EXPECT_TRUE(tokens == want);
  const std::string u16 = (std::filesystem::path(::testing::TempDir()) /
                           ("adjsh_long_" + std::to_string(::getpid()) + ".u16"))
                              .string();
  ASSERT_TRUE(WriteTokenFile(u16, want).ok());
  absl::StatusOr<std::vector<uint32_t>> read = ReadTokenFile(u16);
  std::filesystem::remove(u16);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), want.size());
  for (int64_t t : {int64_t{0}, (int64_t{1} << 23) - 1, int64_t{1} << 23, kLongT - 1})
    EXPECT_EQ((*read)[t], want[t]) << "token " << t;
  EXPECT_TRUE(*read == want);
}

TEST(LongContext, SpanSchedulePathMatchesPrediction) {
  // K = 2, the span schedule workers run (engine/span_step.h): with the default spans, one per
  // chunk here (257 spans of 32K tokens), every summary, combine, halo and tree-reduced partial
  // at offsets past 2^23 tokens.
  const ModelParams<double> params = ForgetfulModel<double>(2);
  const GradOptions opt = Options(Schedule::kSpans);
  const Prediction want = Predict<double>(2, opt);
  absl::StatusOr<GradResult<double>> r = ComputeGradient<double>(params, LongTokens(), opt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->profile.spans, (kLongT + kChunk - 1) / kChunk);
  std::printf("span schedule (K = 2, %lld spans), T = %lld:\n",
              static_cast<long long>(r->profile.spans), static_cast<long long>(kLongT));
  ExpectMatches(*r, want, kTolF64);
}

// The other paths with K = 1 (half the time; the layer coupling is covered above).
TEST(LongContext, TwoPassMatchesPrediction) {
  const GradOptions opt = Options(Schedule::kTwoPass);
  const Prediction want = Predict<double>(1, opt);
  absl::StatusOr<GradResult<double>> r =
      ComputeGradient<double>(ForgetfulModel<double>(1), LongTokens(), opt);
  ASSERT_TRUE(r.ok()) << r.status();
  std::printf("two-pass, T = %lld:\n", static_cast<long long>(kLongT));
  ExpectMatches(*r, want, kTolF64);
}

TEST(LongContext, WindowedMatchesPrediction) {
  const GradOptions opt = Options(Schedule::kWavefront, kWindow);
  const Prediction want = Predict<double>(1, opt);
  absl::StatusOr<GradResult<double>> r =
      ComputeGradient<double>(ForgetfulModel<double>(1), LongTokens(), opt);
  ASSERT_TRUE(r.ok()) << r.status();
  std::printf("windowed (Wt = %lld), T = %lld:\n", static_cast<long long>(kWindow),
              static_cast<long long>(kLongT));
  ExpectMatches(*r, want, kTolF64);
}

TEST(LongContext, F32WavefrontWithSpilledRowsMatchesPrediction) {
  // f32 sums of up to 8M terms (258 chunks of up to 32K tokens, added into partials of the
  // chunks starting in each 16 x 32K rows, 16 of them; 32K additions into each embedding row):
  // rounding ~sqrt(terms) eps ~ 1e-4 relative at worst; a lost 32K chunk (4e-3) or a misplaced
  // block of rows is far above 1e-3. The layer inputs live in
  // memory-mapped spill files (T D f32 = 134 MB), as with --spill-dir.
  GradOptions opt = Options(Schedule::kWavefront);
  opt.spill_dir = ::testing::TempDir();
  const Prediction want = Predict<double>(1, opt);
  absl::StatusOr<GradResult<float>> r =
      ComputeGradient<float>(ForgetfulModel<float>(1), LongTokens(), opt);
  ASSERT_TRUE(r.ok()) << r.status();
  std::printf("f32 wavefront, spilled rows, T = %lld:\n", static_cast<long long>(kLongT));
  ExpectMatches(*r, want, 1e-3);
}

}  // namespace
}  // namespace adjsh
