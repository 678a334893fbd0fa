// The channel-blocked scans (kernels/cpu/scan_block.h) against the per-channel ones
// (kernels/cpu/scan.h) and against their own portable build (simd::Lanes):
//  * native == portable bit for bit, every output, f32 and f64, N = 16 (the compiled-in lane
//    count) and N = 5 and 12 (run-time N: a partial group of 8 states in the dB/dC sums), Di
//    a multiple of the block width and not (the last channels one by one);
//  * in f64 the outputs scan_block.h says are bitwise those of scan.h (h_end, the adjoint
//    summary, dD) are, and the reassociated ones (mu_out, y, dDelta, dx', dA, dB, dC) agree below
//    1e-13 relative (a sum of n terms reordered moves by about n u |terms|, u = 1.1e-16); in f32,
//    where the decays also differ (Exp2Fast against ExpFast, each within 2.2e-7), everything
//    agrees below 2e-5 relative (up to 40 rows of decays compound: 40 x 4.4e-7);
//  * the truncated window (run by scan.h's kernel) is bitwise scan.h's.
#include "kernels/cpu/scan_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "kernels/cpu/math.h"
#include "kernels/cpu/scan_block_impl.h"
#include "kernels/cpu/simd.h"
#include "tests/kernels/test_util.h"

namespace adjsh::cpu {
namespace {

using ::adjsh::testing::RelErr;

struct Shape {
  int64_t M, len, Di, N;
  bool with_state;  // h0 and mu non-zero (else nullptr)
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "M" << s.M << "_len" << s.len << "_Di" << s.Di << "_N" << s.N
      << (s.with_state ? "_state" : "_zero");
}

template <typename T>
struct Case {
  Shape s;
  int64_t Q;  // row stride of B and C: [d | B | C] with a dt rank of 3
  std::vector<T> dt, xc, bc, A, ybar, h0, mu, dskip;

  explicit Case(Shape shape) : s(shape), Q(3 + 2 * shape.N) {
    std::mt19937_64 rng(7 + s.Di * 31 + s.N);
    std::normal_distribution<double> g(0, 1);
    auto fill = [&](std::vector<T>& v, int64_t n, double scale) {
      v.resize(n);
      for (auto& e : v) e = T(g(rng) * scale);
    };
    fill(dt, s.M * s.Di, 1);
    for (auto& e : dt) e = T(std::log1p(std::exp(double(e) - 1)));  // Delta > 0
    fill(xc, s.M * s.Di, 1), fill(bc, s.M * Q, 1), fill(ybar, s.M * s.Di, 1);
    fill(A, s.Di * s.N, 0.5);
    for (auto& e : A) e = T(-std::exp(double(e)));
    fill(h0, s.Di * s.N, 1), fill(mu, s.Di * s.N, 1), fill(dskip, s.Di, 1);
  }
  ScanInputs<T> In() const {
    ScanInputs<T> in;
    in.M = s.M, in.Di = s.Di, in.N = s.N;
    in.dt = dt.data(), in.xc = xc.data(), in.B = bc.data() + 3, in.C = bc.data() + 3 + s.N;
    in.bc_stride = Q, in.A = A.data();
    return in;
  }
  const T* H0() const { return s.with_state ? h0.data() : nullptr; }
  const T* Mu() const { return s.with_state ? mu.data() : nullptr; }
};

template <typename T>
struct Outputs {
  std::vector<T> h_end, y_fwd, m, y, ddt, dxc, dB, dC, dA, dD, mu_out;
  explicit Outputs(const Shape& s)
      : h_end(s.Di * s.N),
        y_fwd(s.M * s.Di),
        m(s.Di * s.N),
        y(s.len * s.Di),
        ddt(s.len * s.Di),
        dxc(s.len * s.Di),
        dB(s.len * s.N),
        dC(s.len * s.N),
        dA(s.Di * s.N, T(0.25)),
        dD(s.Di, T(0.5)),
        mu_out(s.Di * s.N) {}
  ScanGrads<T> Grads() {
    return {y.data(),  ddt.data(), dxc.data(), dB.data(),
            dC.data(), dA.data(),  dD.data(),  mu_out.data()};
  }
};

enum class Impl { kNative, kPortable, kPerChannel };

template <typename T>
Outputs<T> RunScan(const Case<T>& c, Impl impl, int64_t window = 0) {
  Outputs<T> o(c.s);
  const ScanInputs<T> in = c.In();
  const ScanBackwardOptions opt{c.s.len, window};
  const int64_t N = c.s.N;
  if (impl == Impl::kPerChannel) {
    ScanScratch<T> scratch;
    const ScanGrads<T> g = o.Grads();
    for (int64_t i = 0; i < c.s.Di; ++i) {
      const T* h0 = c.H0() ? c.H0() + i * N : nullptr;
      ScanForwardChannel<T>(in, i, c.s.M, h0, c.dskip[i], o.h_end.data() + i * N, o.y_fwd.data());
      ScanAdjointSummaryChannel<T>(in, i, c.s.len, c.ybar.data(), o.m.data() + i * N);
      ScanBackwardChannel<T>(in, i, opt, h0, c.Mu() ? c.Mu() + i * N : nullptr, c.ybar.data(),
                             c.dskip[i], scratch, g);
    }
  } else if (impl == Impl::kNative) {
    ScanForward<T>(in, c.s.M, c.H0(), c.dskip.data(), o.h_end.data(), o.y_fwd.data());
    ScanAdjointSummary<T>(in, c.s.len, c.ybar.data(), o.m.data());
    ScanBackward<T>(in, opt, c.H0(), c.Mu(), c.ybar.data(), c.dskip.data(), o.Grads());
  } else {
    ScanForwardPortable<T>(in, c.s.M, c.H0(), c.dskip.data(), o.h_end.data(), o.y_fwd.data());
    ScanAdjointSummaryPortable<T>(in, c.s.len, c.ybar.data(), o.m.data());
    ScanBackwardPortable<T>(in, opt, c.H0(), c.Mu(), c.ybar.data(), c.dskip.data(), o.Grads());
  }
  return o;
}

template <typename T>
bool Same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

#define EXPECT_SAME(a, b, what) EXPECT_TRUE(Same(a.what, b.what)) << #what

class ScanBlockTest : public ::testing::TestWithParam<Shape> {};

template <typename T>
void CheckNativeIsPortable(const Shape& s) {
  const Case<T> c(s);
  const Outputs<T> a = RunScan(c, Impl::kNative), b = RunScan(c, Impl::kPortable);
  EXPECT_SAME(a, b, h_end);
  EXPECT_SAME(a, b, y_fwd);
  EXPECT_SAME(a, b, m);
  EXPECT_SAME(a, b, y);
  EXPECT_SAME(a, b, ddt);
  EXPECT_SAME(a, b, dxc);
  EXPECT_SAME(a, b, dB);
  EXPECT_SAME(a, b, dC);
  EXPECT_SAME(a, b, dA);
  EXPECT_SAME(a, b, dD);
  EXPECT_SAME(a, b, mu_out);
}

TEST_P(ScanBlockTest, NativeEqualsPortableBitwise) {
  CheckNativeIsPortable<float>(GetParam());
  CheckNativeIsPortable<double>(GetParam());
}

template <typename T>
void CheckAgainstPerChannel(const Shape& s, double tol) {
  const Case<T> c(s);
  const Outputs<T> a = RunScan(c, Impl::kNative), b = RunScan(c, Impl::kPerChannel);
  if constexpr (sizeof(T) == 8) {
    EXPECT_SAME(a, b, h_end);
    EXPECT_SAME(a, b, m);
    EXPECT_SAME(a, b, dD);
    EXPECT_LT(RelErr(a.mu_out, b.mu_out), tol) << "mu_out";
  } else {
    EXPECT_LT(RelErr(a.h_end, b.h_end), tol) << "h_end";
    EXPECT_LT(RelErr(a.m, b.m), tol) << "m";
    EXPECT_LT(RelErr(a.mu_out, b.mu_out), tol) << "mu_out";
    EXPECT_SAME(a, b, dD);  // no decay in it
  }
  EXPECT_LT(RelErr(a.y_fwd, b.y_fwd), tol) << "forward y";
  EXPECT_LT(RelErr(a.y, b.y), tol) << "y";
  EXPECT_LT(RelErr(a.ddt, b.ddt), tol) << "dDelta";
  EXPECT_LT(RelErr(a.dxc, b.dxc), tol) << "dx'";
  EXPECT_LT(RelErr(a.dA, b.dA), tol) << "dA";
  EXPECT_LT(RelErr(a.dB, b.dB), tol) << "dB";
  EXPECT_LT(RelErr(a.dC, b.dC), tol) << "dC";
}

TEST_P(ScanBlockTest, MatchesPerChannelScan) {
  CheckAgainstPerChannel<float>(GetParam(), 2e-5);
  CheckAgainstPerChannel<double>(GetParam(), 1e-13);
}

TEST(MathTest, Exp2FastIsAccurate) {
  // Every float step of 2^-12 on [-125, 10], relative to the f64 2^y.
  double worst = 0;
  for (double y = -125; y <= 10; y += 1.0 / 4096) {
    const double want = std::exp2(double(float(y)));
    worst = std::max(worst, std::abs(double(Exp2Fast(float(y))) / want - 1));
  }
  EXPECT_LT(worst, 2.2e-7);
  EXPECT_EQ(Exp2Fast(-1000.0f), Exp2Fast(-125.0f));
  EXPECT_EQ(Exp2Fast(0.0f), 1.000000119e+00f);
}

TEST_P(ScanBlockTest, BackwardMuOutFromZeroIsTheAdjointSummary) {
  Shape s = GetParam();
  s.with_state = false;  // mu = 0: the backward's lambda is the summary's local reverse scan
  const Case<float> c(s);
  const Outputs<float> o = RunScan(c, Impl::kNative);
  EXPECT_TRUE(Same(o.mu_out, o.m));
}

TEST_P(ScanBlockTest, WindowRunsThePerChannelKernel) {
  Shape s = GetParam();
  if (s.M == s.len) s.M = s.len + 7;  // lookahead rows
  const Case<float> c(s);
  const Outputs<float> a = RunScan(c, Impl::kNative, 5), b = RunScan(c, Impl::kPerChannel, 5);
  EXPECT_SAME(a, b, y);
  EXPECT_SAME(a, b, ddt);
  EXPECT_SAME(a, b, dB);
  EXPECT_SAME(a, b, dA);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ScanBlockTest,
                         ::testing::Values(Shape{37, 37, 24, 16, true},  // full blocks, N = 16
                                           Shape{40, 33, 27, 16, true},  // 3 channels left over
                                           Shape{29, 29, 27, 5, true},   // run-time N
                                           Shape{29, 29, 27, 12, true},  // 8 states and 4 more
                                           Shape{64, 64, 16, 16, false}, Shape{1, 1, 9, 3, true}));

// With 8- or 16-lane vectors and N = 16 the backward runs both its passes once per group of 8
// states, carrying each row's y sum (pass 1) and its dDelta and dx' sums (pass 2) from the first
// group to the second; with N known only at run time (kN = 0) it runs all 16 at once. Both must
// give the same bits, every output.
TEST(ScanBlockSweepTest, TwoGroupsOfStatesAreOneGroupBitForBit) {
  using V = simd::Lanes<float, 8>;
  for (const Shape& s : {Shape{37, 37, 24, 16, true}, Shape{40, 33, 27, 16, false}}) {
    const Case<float> c(s);
    const ScanInputs<float> in = c.In();
    Outputs<float> two(s), one(s);
    blocked::BackwardAll<V, 16>(in, s.len, c.H0(), c.Mu(), c.ybar.data(), c.dskip.data(),
                                two.Grads());
    blocked::BackwardAll<V, 0>(in, s.len, c.H0(), c.Mu(), c.ybar.data(), c.dskip.data(),
                               one.Grads());
    EXPECT_SAME(two, one, y);
    EXPECT_SAME(two, one, ddt);
    EXPECT_SAME(two, one, dxc);
    EXPECT_SAME(two, one, dB);
    EXPECT_SAME(two, one, dC);
    EXPECT_SAME(two, one, dA);
    EXPECT_SAME(two, one, dD);
    EXPECT_SAME(two, one, mu_out);
  }
}

TEST(SimdTest, LaneSumsFollowThePairwiseTree) {
  // Values chosen so that every association order of the 8 lanes gives a different float.
  const float v[8] = {1e8f, 1.0f, -1e8f, 3.0f, 0.5f, 7e7f, -7e7f, 0.25f};
  const float tree = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
  const simd::Native<float> n = simd::Native<float>::Load(v);
  EXPECT_EQ(n.Sum(), tree);
  EXPECT_EQ((simd::Lanes<float, 8>::Load(v).Sum()), tree);
  simd::Native<float> p[8];
  for (int g = 0; g < 8; ++g) {
    float w[8];
    for (int c = 0; c < 8; ++c) w[c] = v[(c + g) % 8];
    p[g] = simd::Native<float>::Load(w);
  }
  float sums[8];
  simd::Native<float>::SumEach(p).Store(sums);
  for (int g = 0; g < 8; ++g) EXPECT_EQ(sums[g], p[g].Sum()) << g;
}

#ifdef ADJSH_SIMD_AVX512
TEST(SimdTest, WideDecayIsTheScalarDecayBitForBit) {
  // Arguments dt * coef from 0 down past the clamp at -125, with every rounding of k.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> dt(0.0f, 40.0f), coef(-6.0f, -1e-3f);
  for (int rep = 0; rep < 4096; ++rep) {
    float d[16], c[16], got[16];
    for (int l = 0; l < 16; ++l) d[l] = dt(rng), c[l] = coef(rng);
    if (rep == 0) d[0] = 0.0f, d[1] = 1e30f;  // exp(0) = 1; far below the clamp
    simd::F32x8x2::Decay(simd::F32x8x2::Load(d), simd::F32x8x2::Load(c)).Store(got);
    for (int l = 0; l < 16; ++l)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[l]), std::bit_cast<uint32_t>(Decay<float>(d[l], c[l])))
          << d[l] << " * " << c[l];
  }
}

TEST(SimdTest, SumHalves8FollowsEachHalfsPairwiseTree) {
  // Magnitudes from 1e-3 to 1e8 with both signs: every other association order moves the sum.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-3, 8);
  for (int rep = 0; rep < 256; ++rep) {
    simd::F32x8x2 p[8];
    for (auto& v : p) {
      float w[16];
      for (float& e : w) e = mant(rng) * std::pow(10.0f, float(ex(rng)));
      v = simd::F32x8x2::Load(w);
    }
    float s[16];
    simd::F32x8x2::SumHalves8(p).Store(s);
    for (int n = 0; n < 8; ++n) {
      ASSERT_EQ(s[n], p[n].Half(0).Sum()) << n;
      ASSERT_EQ(s[8 + n], p[n].Half(1).Sum()) << n;
    }
  }
}
#endif

}  // namespace
}  // namespace adjsh::cpu
