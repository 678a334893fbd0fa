// The CUDA block's non-scan kernels (kernels/cuda/ops_kernels.cuh) compiled for the host and
// run with each block's threads as host threads (host_emulation.h), against plain f64 code:
// RMSNorm forward and backward, the causal conv + silu with its halo rows forward and
// backward, and the blocked cross-entropy (running log-sum-exp over vocabulary blocks, the
// softmax gradient). Runs without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tests/cuda/host_emulation.h"
#include "tests/kernels/test_util.h"
// The kernel source after the emulation macros.
#include "kernels/cuda/ops_kernels.cuh"
#include "kernels/cpu/rmsnorm.h"

namespace adjsh::cuda {
namespace {

using namespace ops_internal;

std::vector<float> Random(int64_t n, uint64_t seed, float lo = -1, float hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

using ::adjsh::testing::RelErr;

double Sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

TEST(OpsEmulationTest, RmsNormForwardAndBackward) {
  const int64_t rows = 5, D = 300;  // D > the block's 256 threads: strided rows
  const std::vector<float> u = Random(rows * D, 1), w = Random(D, 2, 0.5f, 1.5f);
  const std::vector<float> dn = Random(rows * D, 3);
  std::vector<float> n(rows * D), r(rows), dw(D), du(rows * D),
      scratch(RmsNormBackwardScratchImpl(rows, D));
  RmsNormForwardImpl<float>(nullptr, u.data(), rows, D, w.data(), 1e-5f, n.data(), r.data());
  RmsNormBackwardImpl(nullptr, u.data(), rows, D, w.data(), r.data(), dn.data(), dw.data(),
                      du.data(), scratch.data());
  const std::vector<double> u64(u.begin(), u.end()), w64(w.begin(), w.end()),
      dn64(dn.begin(), dn.end());
  std::vector<double> n64(rows * D), r64(rows), dw64(D, 0.0), du64(rows * D);
  cpu::RmsNormForward(u64.data(), rows, D, w64.data(), 1e-5, n64.data(), r64.data());
  cpu::RmsNormBackward(u64.data(), rows, D, w64.data(), r64.data(), dn64.data(), dw64.data(),
                       du64.data());
  EXPECT_LT(RelErr(n, n64), 1e-6);
  EXPECT_LT(RelErr(r, r64), 1e-6);
  EXPECT_LT(RelErr(dw, dw64), 1e-6);
  EXPECT_LT(RelErr(du, du64), 1e-6);
}

TEST(OpsEmulationTest, ConvWithHaloForwardAndBackward) {
  for (int64_t halo : {0, 2, 3}) {
    const int64_t len = 9, Di = 6, W = 4, P = halo + len;
    const std::vector<float> xz = Random(P * 2 * Di, 4), w = Random(Di * W, 5),
                             b = Random(Di, 6), g = Random(len * Di, 7);
    std::vector<float> cpre(len * Di), xc(len * Di), dxz(P * 2 * Di, 0.0f), dw(Di * W), db(Di);
    ConvSiluForwardImpl<float>(nullptr, xz.data(), halo, len, Di, W, w.data(), b.data(),
                               cpre.data(), xc.data());
    std::vector<float> dxc = g;  // dL/dxc in, dL/dcpre out
    std::vector<float> scratch(ConvSiluBackwardScratchImpl(len, Di, W));
    ConvSiluBackwardImpl<float>(nullptr, xz.data(), cpre.data(), halo, len, Di, W, w.data(),
                                dxc.data(), dxz.data(), dw.data(), db.data(), scratch.data());
    // f64 reference: c_t = b + sum_j w[:, j] x_{p}, p = halo + t - W + 1 + j >= 0.
    std::vector<double> c(len * Di), x_ref(len * Di), dx(P * Di, 0.0), dw_ref(Di * W, 0.0),
        db_ref(Di, 0.0);
    for (int64_t t = 0; t < len; ++t)
      for (int64_t i = 0; i < Di; ++i) {
        double v = b[i];
        for (int64_t j = 0; j < W; ++j) {
          const int64_t p = halo + t - (W - 1) + j;
          if (p >= 0) v += double(w[i * W + j]) * xz[p * 2 * Di + i];
        }
        c[t * Di + i] = v;
        x_ref[t * Di + i] = v * Sigmoid(v);
        const double s = Sigmoid(v), dc = g[t * Di + i] * s * (1 + v * (1 - s));
        db_ref[i] += dc;
        for (int64_t j = 0; j < W; ++j) {
          const int64_t p = halo + t - (W - 1) + j;
          if (p < 0) continue;
          dw_ref[i * W + j] += dc * xz[p * 2 * Di + i];
          dx[p * Di + i] += double(w[i * W + j]) * dc;
        }
      }
    std::vector<float> dx_got(P * Di);
    for (int64_t p = 0; p < P; ++p)
      for (int64_t i = 0; i < Di; ++i) {
        dx_got[p * Di + i] = dxz[p * 2 * Di + i];
        EXPECT_EQ(dxz[p * 2 * Di + Di + i], 0.0f);  // z columns untouched
      }
    EXPECT_LT(RelErr(cpre, c), 1e-6) << "halo " << halo;
    EXPECT_LT(RelErr(xc, x_ref), 1e-6);
    EXPECT_LT(RelErr(dx_got, dx), 1e-6);
    EXPECT_LT(RelErr(dw, dw_ref), 1e-6);
    EXPECT_LT(RelErr(db, db_ref), 1e-6);
  }
}

// Three vocabulary blocks (the last partial), a row without a target: the running
// log-sum-exp and the gradient equal the softmax over the whole row.
TEST(OpsEmulationTest, BlockedCrossEntropy) {
  const int64_t M = 4, V = 700, Vb = 256;
  const std::vector<float> logits = Random(M * V, 8, -6, 6);
  const std::vector<int64_t> targets = {3, 699, -1, 300};
  const float scale = 0.25f;
  std::vector<float> mx(M), sum(M), tl(M), grad(M * V);
  for (int64_t v0 = 0; v0 < V; v0 += Vb) {
    const int64_t vb = std::min(Vb, V - v0);
    std::vector<float> block(M * vb);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t v = 0; v < vb; ++v) block[r * vb + v] = logits[r * V + v0 + v];
    CeStatsImpl(nullptr, block.data(), M, vb, v0, targets.data(), v0 == 0, mx.data(), sum.data(),
                tl.data());
  }
  for (int64_t v0 = 0; v0 < V; v0 += Vb) {
    const int64_t vb = std::min(Vb, V - v0);
    std::vector<float> block(M * vb), dl(M * vb);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t v = 0; v < vb; ++v) block[r * vb + v] = logits[r * V + v0 + v];
    CeGradImpl<float>(nullptr, block.data(), M, vb, v0, targets.data(), mx.data(), sum.data(),
                      scale, dl.data());
    for (int64_t r = 0; r < M; ++r)
      for (int64_t v = 0; v < vb; ++v) grad[r * V + v0 + v] = dl[r * vb + v];
  }
  for (int64_t r = 0; r < M; ++r) {
    double m = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double(logits[r * V + v]));
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits[r * V + v] - m);
    std::vector<double> want(V);
    std::vector<float> got(grad.begin() + r * V, grad.begin() + (r + 1) * V);
    for (int64_t v = 0; v < V; ++v) {
      want[v] = targets[r] < 0 ? 0 : scale * (std::exp(logits[r * V + v] - m) / s -
                                              (v == targets[r] ? 1 : 0));
    }
    EXPECT_LT(RelErr(got, want), 1e-5) << "row " << r;
    if (targets[r] < 0) continue;
    const double loss = std::log(double(sum[r])) + mx[r] - tl[r];
    const double want_loss = std::log(s) + m - logits[r * V + targets[r]];
    EXPECT_NEAR(loss, want_loss, 1e-5 * std::abs(want_loss)) << "row " << r;
  }
}

// The weight gradients' two-stage reductions (ops_kernels.cuh) over many rows: several slices
// of rows (stage 1, 2-D grids of column blocks x slices, the last column block partial), summed
// in order (stage 2). Error bound: each product (two or one f32 roundings) passes through at most
// h = lane rows + kReduceLanes + slices f32 additions (within a lane, over the lanes, over the
// slices), so |got - exact| <= (h + 2) 2^-24 sum |terms| to first order; checked per entry
// against the f64 sum of the same f32 inputs.
int64_t SumDepth(int64_t rows) {
  const int64_t slices = ReduceSlices(rows);
  const int64_t per_slice = (rows + slices - 1) / slices;
  const int64_t per_lane = (per_slice + kReduceLanes - 1) / kReduceLanes;
  return per_lane + kReduceLanes + slices;
}
constexpr double kUnit = 1.0 / (1 << 24);

TEST(OpsEmulationTest, RmsNormWeightGradOverManySlices) {
  // Up to 33,000 rows: the most slices (kReduceMaxSlices), more than kReduceMinRows rows each.
  for (const int64_t rows : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{2000}, int64_t{33000}}) {
    const int64_t D = rows > 10000 ? 8 : 100;  // 1 and 4 column blocks, the last partial
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " D " << D);
    const std::vector<float> u = Random(rows * D, 11), dn = Random(rows * D, 12),
                             r = Random(rows, 13, 0.5f, 2.0f);
    std::vector<float> dw(D, -7.0f), scratch(RmsNormBackwardScratchImpl(rows, D));
    RmsNormWeightGradImpl(nullptr, u.data(), rows, D, r.data(), dn.data(), dw.data(),
                          scratch.data());
    const double bound = (SumDepth(rows) + 2) * kUnit;
    for (int64_t d = 0; d < D; ++d) {
      double want = 0, abs_sum = 0;
      for (int64_t t = 0; t < rows; ++t) {
        const double term = double(dn[t * D + d]) * u[t * D + d] * r[t];
        want += term, abs_sum += std::abs(term);
      }
      ASSERT_LE(std::abs(dw[d] - want), bound * abs_sum * 1.0001) << "d " << d;
    }
  }
}

TEST(OpsEmulationTest, ConvWeightGradOverManySlices) {
  for (const int64_t halo : {0, 3}) {
    const int64_t len = 1000, Di = 70, W = 4, P = halo + len;  // 16 slices, 3 column blocks
    const std::vector<float> xz = Random(P * 2 * Di, 14), dc = Random(len * Di, 15);
    std::vector<float> dw(Di * W, -7.0f), db(Di, -7.0f),
        scratch(ConvSiluBackwardScratchImpl(len, Di, W));
    ConvWeightGradImpl<float>(nullptr, xz.data(), dc.data(), halo, len, Di, W, dw.data(),
                              db.data(), scratch.data());
    const double bound = (SumDepth(len) + 2) * kUnit;
    for (int64_t i = 0; i < Di; ++i) {
      double want_b = 0, abs_b = 0;
      for (int64_t t = 0; t < len; ++t) want_b += dc[t * Di + i], abs_b += std::abs(dc[t * Di + i]);
      ASSERT_LE(std::abs(db[i] - want_b), bound * abs_b * 1.0001) << "db " << i;
      for (int64_t j = 0; j < W; ++j) {
        double want = 0, abs_sum = 0;
        for (int64_t t = 0; t < len; ++t) {
          const int64_t p = halo + t - (W - 1) + j;
          if (p < 0) continue;
          const double term = double(dc[t * Di + i]) * xz[p * 2 * Di + i];
          want += term, abs_sum += std::abs(term);
        }
        ASSERT_LE(std::abs(dw[i * W + j] - want), bound * abs_sum * 1.0001)
            << "halo " << halo << " dw " << i << "," << j;
      }
    }
  }
}

// The same inputs give the same bits, whatever the scratch held before (every partial is
// written by its call: NaN-filled scratch the second time).
TEST(OpsEmulationTest, WeightGradReductionsAreBitwiseRepeatable) {
  const int64_t rows = 1000, D = 100, Di = 40, W = 4, halo = 2;
  const std::vector<float> u = Random(rows * D, 16), dn = Random(rows * D, 17),
                           r = Random(rows, 18, 0.5f, 2.0f);
  const std::vector<float> xz = Random((halo + rows) * 2 * Di, 19), dc = Random(rows * Di, 20);
  auto run = [&](float fill) {
    std::vector<float> rs(RmsNormBackwardScratchImpl(rows, D), fill),
        cs(ConvSiluBackwardScratchImpl(rows, Di, W), fill);
    std::vector<float> out(D + Di * W + Di);
    RmsNormWeightGradImpl(nullptr, u.data(), rows, D, r.data(), dn.data(), out.data(), rs.data());
    ConvWeightGradImpl<float>(nullptr, xz.data(), dc.data(), halo, rows, Di, W, out.data() + D,
                              out.data() + D + Di * W, cs.data());
    return out;
  };
  const std::vector<float> a = run(0.0f), b = run(std::nanf(""));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace adjsh::cuda
