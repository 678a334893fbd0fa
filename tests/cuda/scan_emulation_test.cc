// The CUDA scan kernels (kernels/cuda/scan_kernels.cuh), compiled for the host and run with
// each block's threads as host threads (host_emulation.h), against the CPU scan in f64: the
// forward (o, h_end), the span schedule's chunk summaries (h_local, m, S) and the fused exact
// backward (o, dz, dL/d dtpre, dx', dB, dC, dA_log, D, db_dt, mu_out) over shapes that cover
// one and several segments, partial last tiles and segments, several channel blocks, lanes
// beyond N, and zero or non-zero h0 and mu. Runs on every machine with the CUDA toolkit: it
// checks the kernels' indexing, segment joins and reductions without a GPU (the GPU's own
// arithmetic is checked by cuda_backend_test).
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <random>
#include <vector>

#include "tests/cuda/host_emulation.h"
#include "tests/kernels/test_util.h"
// The kernel source after the emulation macros.
#include "kernels/cuda/scan_kernels.cuh"
#include "kernels/cpu/scan.h"

namespace adjsh::cuda {
namespace {

double Softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
double Sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
double Silu(double x) { return x * Sigmoid(x); }
double SiluGrad(double x) {
  const double s = Sigmoid(x);
  return s * (1 + x * (1 - s));
}

using ::adjsh::testing::RelErr;

struct Shape {
  int64_t len, halo, Di, N, R;
  bool with_state;
};

// Names the case in test output (the default prints raw bytes, padding included).
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "len" << s.len << "_halo" << s.halo << "_Di" << s.Di << "_N" << s.N << "_R" << s.R
      << (s.with_state ? "_state" : "_zero");
}

class ScanEmulationTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ScanEmulationTest, MatchesCpuScanInF64) {
  const Shape sh = GetParam();
  const int64_t len = sh.len, halo = sh.halo, Di = sh.Di, N = sh.N, R = sh.R, Q = R + 2 * N;
  const int64_t P = halo + len;
  std::mt19937_64 rng(len * 131 + Di * 7 + N);
  std::uniform_real_distribution<float> u(-1, 1);
  auto fill = [&](int64_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& x : v) x = lo + (hi - lo) * (u(rng) + 1) / 2;
    return v;
  };
  const std::vector<float> dtpre = fill(len * Di, -1.5f, 0.5f), dt_b = fill(Di, -3, -1);
  const std::vector<float> xc = fill(len * Di, -1, 1), dbc = fill(len * Q, -1, 1);
  const std::vector<float> xz = fill(P * 2 * Di, -2, 2), Dskip = fill(Di, 0.5f, 1.5f);
  std::vector<float> A(Di * N);
  for (int64_t k = 0; k < Di * N; ++k) A[k] = -static_cast<float>(1 + k % N);
  const std::vector<float> d_o = fill(len * Di, -1, 1);
  const std::vector<float> h0 = sh.with_state ? fill(Di * N, -0.5f, 0.5f) : std::vector<float>(Di * N);
  const std::vector<float> mu = sh.with_state ? fill(Di * N, -0.5f, 0.5f) : std::vector<float>();

  // The CPU f64 scan on the same inputs (Delta, ybar computed here in f64).
  std::vector<double> dt(len * Di), ybar(len * Di), z(len * Di), pre(len * Di);
  for (int64_t t = 0; t < len; ++t)
    for (int64_t i = 0; i < Di; ++i) {
      const int64_t k = t * Di + i;
      pre[k] = double(dtpre[k]) + double(dt_b[i]);
      dt[k] = Softplus(pre[k]);
      z[k] = xz[(halo + t) * 2 * Di + Di + i];
      ybar[k] = double(d_o[k]) * Silu(z[k]);
    }
  const std::vector<double> xc64(xc.begin(), xc.end()), dbc64(dbc.begin(), dbc.end());
  const std::vector<double> A64(A.begin(), A.end()), h064(h0.begin(), h0.end());
  const std::vector<double> mu64(mu.begin(), mu.end());
  cpu::ScanInputs<double> in;
  in.M = len, in.Di = Di, in.N = N, in.dt = dt.data(), in.xc = xc64.data();
  in.B = dbc64.data() + R, in.C = dbc64.data() + R + N, in.bc_stride = Q, in.A = A64.data();
  std::vector<double> y(len * Di), yf(len * Di), ddt(len * Di), dxc(len * Di), dB(len * N),
      dC(len * N), dA(Di * N), dD(Di), mu_out(Di * N), h_end(Di * N);
  cpu::ScanGrads<double> g{y.data(), ddt.data(), dxc.data(), dB.data(), dC.data(), dA.data(),
                           dD.data(), mu_out.data()};
  cpu::ScanScratch<double> scratch;
  for (int64_t i = 0; i < Di; ++i) {
    cpu::ScanForwardChannel<double>(in, i, len, h064.data() + i * N, Dskip[i], h_end.data() + i * N,
                                    yf.data());
    cpu::ScanBackwardChannel<double>(in, i, {len, 0}, h064.data() + i * N,
                                     mu.empty() ? nullptr : mu64.data() + i * N, ybar.data(),
                                     Dskip[i], scratch, g);
  }
  std::vector<double> o_ref(len * Di), dz_ref(len * Di), ddtpre_ref(len * Di), dtb_ref(Di, 0.0),
      dA_log_ref(Di * N);
  for (int64_t k = 0; k < len * Di; ++k) {
    o_ref[k] = y[k] * Silu(z[k]);
    dz_ref[k] = double(d_o[k]) * y[k] * SiluGrad(z[k]);
    ddtpre_ref[k] = ddt[k] * Sigmoid(pre[k]);
    dtb_ref[k % Di] += ddtpre_ref[k];
  }
  for (int64_t k = 0; k < Di * N; ++k) dA_log_ref[k] = dA[k] * A64[k];

  // The kernels, emulated.
  ScanArgs<float> a;
  a.len = len, a.halo = halo, a.Di = Di, a.N = N, a.R = R;
  a.dtpre = dtpre.data(), a.dt_b = dt_b.data(), a.xc = xc.data(), a.dbc = dbc.data();
  a.xz = xz.data(), a.A = A.data(), a.Dskip = Dskip.data();
  std::vector<float> fo(len * Di), fh_end(Di * N), fscratch(scan_internal::ScanForwardScratchImpl(len, Di, N));
  scan_internal::ScanForwardImpl<float>(nullptr, a, sh.with_state ? h0.data() : nullptr,
                                        fh_end.data(), fo.data(), fscratch.data());
  std::vector<double> o_fwd_ref(len * Di);
  for (int64_t k = 0; k < len * Di; ++k) o_fwd_ref[k] = yf[k] * Silu(z[k]);
  EXPECT_LT(RelErr(fo, o_fwd_ref), 1e-5) << "forward o";
  EXPECT_LT(RelErr(fh_end, h_end), 1e-5) << "forward h_end";

  // The chunk summaries (the span schedule's): h_local from a zero state, m from a zero
  // adjoint, S = sum of Delta.
  std::vector<double> hloc_ref(Di * N), m_ref(Di * N), S_ref(Di, 0.0);
  for (int64_t i = 0; i < Di; ++i) {
    cpu::ScanForwardChannel<double>(in, i, len, nullptr, Dskip[i], hloc_ref.data() + i * N,
                                    nullptr);
    cpu::ScanAdjointSummaryChannel<double>(in, i, len, ybar.data(), m_ref.data() + i * N);
  }
  for (int64_t k = 0; k < len * Di; ++k) S_ref[k % Di] += dt[k];
  std::vector<float> hloc(Di * N), sm(Di * N), S1(Di), S2(Di),
      sscratch(scan_internal::ScanSummaryScratchImpl(len, Di, N));
  scan_internal::ScanSummaryImpl<float>(nullptr, a, nullptr, hloc.data(), nullptr, S1.data(),
                                        sscratch.data());
  scan_internal::ScanSummaryImpl<float>(nullptr, a, d_o.data(), nullptr, sm.data(), S2.data(),
                                        sscratch.data());
  EXPECT_LT(RelErr(hloc, hloc_ref), 1e-5) << "summary h_local";
  EXPECT_LT(RelErr(sm, m_ref), 1e-5) << "summary m";
  EXPECT_LT(RelErr(S1, S_ref), 1e-5) << "summary S";
  EXPECT_EQ(S1, S2) << "S is the same sum in both summaries";

  ScanBackwardArgs<float> b;
  std::vector<float> bo(len * Di), dxz(P * 2 * Di, 0.0f), bddt(len * Di), bdxc(len * Di),
      ddbc(len * Q, 0.0f), dA_log(Di * N), bdD(Di), ddt_b(Di), bmu_out(Di * N),
      bscratch(scan_internal::ScanBackwardScratchImpl(len, Di, N));
  b.d_o = d_o.data(), b.h0 = h0.data(), b.mu = mu.empty() ? nullptr : mu.data();
  b.o = bo.data(), b.dxz = dxz.data(), b.ddt = bddt.data(), b.dxc = bdxc.data();
  b.ddbc = ddbc.data(), b.dA_log = dA_log.data(), b.dD = bdD.data(), b.ddt_b = ddt_b.data();
  b.mu_out = bmu_out.data(), b.scratch = bscratch.data();
  scan_internal::ScanBackwardImpl<float>(nullptr, a, b);

  std::vector<float> dz(len * Di), gB(len * N), gC(len * N);
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t i = 0; i < Di; ++i) dz[t * Di + i] = dxz[(halo + t) * 2 * Di + Di + i];
    for (int64_t n = 0; n < N; ++n) {
      gB[t * N + n] = ddbc[t * Q + R + n];
      gC[t * N + n] = ddbc[t * Q + R + N + n];
    }
  }
  const double tol = 1e-5;
  EXPECT_LT(RelErr(bo, o_ref), tol) << "o";
  EXPECT_LT(RelErr(dz, dz_ref), tol) << "dz";
  EXPECT_LT(RelErr(bddt, ddtpre_ref), tol) << "dL/d dtpre";
  EXPECT_LT(RelErr(bdxc, dxc), tol) << "dx'";
  EXPECT_LT(RelErr(gB, dB), tol) << "dB";
  EXPECT_LT(RelErr(gC, dC), tol) << "dC";
  EXPECT_LT(RelErr(dA_log, dA_log_ref), tol) << "dA_log";
  EXPECT_LT(RelErr(bdD, dD), tol) << "dD";
  EXPECT_LT(RelErr(ddt_b, dtb_ref), tol) << "db_dt";
  EXPECT_LT(RelErr(bmu_out, mu_out), tol) << "mu_out";
  // Halo rows' dz stays zero, as do the x columns (the conv backward writes those).
  for (int64_t p = 0; p < halo; ++p)
    for (int64_t c = 0; c < 2 * Di; ++c) EXPECT_EQ(dxz[p * 2 * Di + c], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ScanEmulationTest,
    ::testing::Values(Shape{1, 0, 16, 4, 2, false},     // one row
                      Shape{37, 3, 16, 4, 2, true},     // one segment, partial last tile
                      Shape{64, 0, 8, 3, 1, true},      // one full segment; lanes beyond N
                      Shape{150, 2, 16, 4, 2, true},    // three segments, partial last one
                      Shape{70, 1, 72, 8, 3, true},     // three channel blocks, two segments
                      Shape{129, 0, 2, 16, 2, false}));  // N = 16: a whole half-warp a channel

}  // namespace
}  // namespace adjsh::cuda
