// A Mamba-2 layer on a chunk (kernels/cpu/mamba2_layer.h). Per row t, with u the layer input:
//   xn = rmsnorm(u; norm)                         zx = xn in_proj^T = [z | xBC_in | dt_raw]
//   pre = causal depthwise conv(xBC_in) + bias    xbc = silu(pre) = [x | B | C]
//   dt = softplus(dt_raw + dt_bias) (clamped)     A = -exp(A_log)
//   per head h (group g = h / (H / G)): S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T,
//                                       y_t = S_t C_t + D_h x_t
//   gv = y * silu(z); n = rmsnorm per group of Di / G channels (gnorm); out = n out_proj^T
// The scan and its backward are kernels/cpu/mamba2_scan.h's, in the form Mamba2ScanFormFor(L) picks.
#include "kernels/cpu/mamba2_layer.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/mamba2_scan.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/math.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/scratch.h"

namespace adjsh {
namespace {

using cpu::Gemm;
using cpu::Trans;

// kernels/cpu/math.h's: branch-free in f32 (a polynomial exp), so that the element-wise loops
// below vectorise; in f64 libm's exp and log1p (the check mode).
using cpu::Sigmoid;
using cpu::SiluGradGivenSigmoid;
using cpu::Softplus;
using cpu::ThreadScratch;

// The conv weights (Cc, W) as (W, Cc): tap j of every channel contiguous, so that the conv's
// loops over channels vectorise.
template <typename T>
std::vector<T> ConvTaps(const Mamba2Layer<T>& l, const Mamba2Dims& d) {
  std::vector<T> w(d.W * d.Cc);
  for (int64_t c = 0; c < d.Cc; ++c)
    for (int64_t j = 0; j < d.W; ++j) w[j * d.Cc + c] = l.conv_w[c * d.W + j];
  return w;
}

// The gated norm's backward for a chunk's L rows: dy (L, Di) from dn = dL/dn; with gl and dzx
// non-null also the gnorm weight's gradient and dz into dzx's z columns (rows of Dp).
template <typename T>
void GatedNormBackward(const Mamba2Layer<T>& l, const Mamba2Dims& d, const Mamba2ChunkActs<T>& a,
                       const T* dn, T* dy, Mamba2Layer<T>* gl, T* dzx) {
  const int64_t L = a.t1 - a.t0, hb = a.hb, M = d.Di / d.G;
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t j = 0; j < d.G; ++j) {
      const int64_t o = i * d.Di + j * M;
      const T r = a.r2[i * d.G + j];
      T dot = 0;
      for (int64_t c = 0; c < M; ++c) {
        if (gl) gl->gnorm[j * M + c] += dn[o + c] * a.gv[o + c] * r;
        dot += dn[o + c] * l.gnorm[j * M + c] * a.gv[o + c];
      }
      const T coef = r * r * r * dot / T(M);
      for (int64_t c = 0; c < M; ++c) {
        const T dg = r * dn[o + c] * l.gnorm[j * M + c] - a.gv[o + c] * coef;
        const T z = a.zx[(hb + i) * d.Dp + j * M + c], s = Sigmoid(z);
        dy[o + c] = dg * z * s;
        if (dzx) dzx[i * d.Dp + j * M + c] = dg * a.y[o + c] * SiluGradGivenSigmoid(z, s);
      }
    }
  }
}

// A = -exp(A_log) per head, what the scan reads.
template <typename T>
std::vector<T> Decay(const Mamba2Layer<T>& l, const Mamba2Dims& d) {
  std::vector<T> A(d.H);
  for (int64_t h = 0; h < d.H; ++h) A[h] = -std::exp(l.A_log[h]);
  return A;
}

}  // namespace

Mamba2Dims::Mamba2Dims(const Mamba2Config& c)
    : D(c.hidden_size), Di(c.inner()), H(c.num_heads), P(c.head_dim), G(c.n_groups),
      N(c.state_size), W(c.conv_kernel), Cc(c.conv_channels()), Dp(c.in_proj_rows()) {}

template <typename T>
void Mamba2ChunkForward(const Mamba2Layer<T>& l, const Mamba2Config& cfg, const T* u,
                        int64_t t0, int64_t t1, T* S, Mamba2ChunkActs<T>& a, T* out) {
  const Mamba2Dims d(cfg);
  const int64_t L = t1 - t0, hb = std::min(d.W - 1, t0), R = hb + L;
  a.t0 = t0, a.t1 = t1, a.hb = hb;
  a.xn.resize(R * d.D), a.r1.resize(R), a.zx.resize(R * d.Dp);
  cpu::RmsNormForward(u, R, d.D, l.norm.data(), cfg.layer_norm_epsilon,
                      a.xn.data(), a.r1.data());
  Gemm<T>(Trans::kNo, Trans::kYes, R, d.Dp, d.D, T(1), a.xn.data(), d.D, l.in_proj.data(), d.D,
          T(0), a.zx.data(), d.Dp);
  // The causal conv over the xBC channels (zx columns [Di, Di + Cc)), then silu. Row i of the
  // chunk is zx row hb + i; before the sequence's start the conv reads zeros.
  // Each channel sums bias + tap 0 + tap 1 + ... in that order, whatever the loops' order.
  a.pre.resize(L * d.Cc), a.xbc.resize(L * d.Cc);
  const std::vector<T> taps = ConvTaps(l, d);
  for (int64_t i = 0; i < L; ++i) {
    T* pre = &a.pre[i * d.Cc];
    std::copy_n(l.conv_b.begin(), d.Cc, pre);
    for (int64_t j = 0; j < d.W; ++j) {
      const int64_t s = hb + i - (d.W - 1) + j;
      if (s < 0) continue;
      const T* w = &taps[j * d.Cc];
      const T* x = &a.zx[s * d.Dp + d.Di];
      for (int64_t c = 0; c < d.Cc; ++c) pre[c] += w[c] * x[c];
    }
    T* xbc = &a.xbc[i * d.Cc];
    for (int64_t c = 0; c < d.Cc; ++c) xbc[c] = pre[c] * Sigmoid(pre[c]);
  }
  a.dt.resize(L * d.H);
  const T lo = T(cfg.time_step_min_limit), hi = T(cfg.time_step_max_limit);
  for (int64_t i = 0; i < L; ++i) {
    const T* raw = &a.zx[(hb + i) * d.Dp + d.Di + d.Cc];
    T* dt = &a.dt[i * d.H];
    for (int64_t h = 0; h < d.H; ++h) dt[h] = Softplus(raw[h] + l.dt_bias[h]);
    if (cfg.dt_clamped())
      for (int64_t h = 0; h < d.H; ++h) dt[h] = std::clamp(dt[h], lo, hi);
  }
  // The scan from the states before t0.
  const std::vector<T> A = Decay(l, d);
  const Mamba2ScanRows<T> rows{&d, L, a.dt.data(), a.xbc.data(), A.data(), l.D.data()};
  a.S0.assign(S, S + d.H * d.P * d.N);
  if (out) a.y.resize(L * d.Di);
  Mamba2ScanForward(Mamba2ScanFormFor(L), rows, S, out ? a.y.data() : nullptr);
  if (out == nullptr) return;  // the states alone
  // The gated norm: gv = y * silu(z), normalised per group of M = Di / G channels.
  const int64_t M = d.Di / d.G;
  a.gv.resize(L * d.Di), a.r2.resize(L * d.G), a.n.resize(L * d.Di);
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t c = 0; c < d.Di; ++c) {
      const T z = a.zx[(hb + i) * d.Dp + c];
      a.gv[i * d.Di + c] = a.y[i * d.Di + c] * z * Sigmoid(z);
    }
    for (int64_t j = 0; j < d.G; ++j) {
      const T* gv = &a.gv[i * d.Di + j * M];
      T ss = 0;
      for (int64_t c = 0; c < M; ++c) ss += gv[c] * gv[c];
      const T r = T(1) / std::sqrt(ss / T(M) + T(cfg.layer_norm_epsilon));
      a.r2[i * d.G + j] = r;
      for (int64_t c = 0; c < M; ++c) a.n[i * d.Di + j * M + c] = gv[c] * r * l.gnorm[j * M + c];
    }
  }
  Gemm<T>(Trans::kNo, Trans::kYes, L, d.D, d.Di, T(1), a.n.data(), d.Di, l.out_proj.data(), d.Di,
          T(0), out, d.D);
}

// The backward's per-thread scratch (kernels/cpu/scratch.h): a chunk's dn, dy, dzx, dxbc and
// dxn are O(L Dp) each, allocated, zero-filled and faulted in afresh by every call before.
namespace {
enum Slot { kDn, kDy, kDzx, kDxbc, kDxn, kSlots };
}  // namespace

template <typename T>
void Mamba2ChunkBackward(const Mamba2Layer<T>& l, const Mamba2Config& cfg, const T* u,
                         const Mamba2ChunkActs<T>& a, const T* dout, T* carry, T* halo,
                         Mamba2Layer<T>& gl, T* du) {
  const Mamba2Dims d(cfg);
  const int64_t t0 = a.t0, t1 = a.t1, L = t1 - t0, hb = a.hb;
  cpu::AlignedVector<T>& dn = ThreadScratch<T>(kDn, L * d.Di);
  Gemm<T>(Trans::kNo, Trans::kNo, L, d.Di, d.D, T(1), dout, d.D, l.out_proj.data(), d.Di, T(0),
          dn.data(), d.Di);
  Gemm<T>(Trans::kYes, Trans::kNo, d.D, d.Di, L, T(1), dout, d.D, a.n.data(), d.Di, T(1),
          gl.out_proj.data(), d.Di);
  // The gated norm, back to dy and dz (dzx's z columns). dzx holds the chunk's rows only.
  cpu::AlignedVector<T>& dzx = ThreadScratch<T>(kDzx, L * d.Dp, true);
  cpu::AlignedVector<T>& dy = ThreadScratch<T>(kDy, L * d.Di);
  GatedNormBackward(l, d, a, dn.data(), dy.data(), &gl, dzx.data());
  // The scan's backward, its states recomputed from S0.
  const std::vector<T> A = Decay(l, d);
  const Mamba2ScanRows<T> rows{&d, L, a.dt.data(), a.xbc.data(), A.data(), l.D.data()};
  cpu::AlignedVector<T>& dxbc = ThreadScratch<T>(kDxbc, L * d.Cc, true);
  std::vector<T> ddt(L * d.H, T(0)), dA(d.H, T(0)), dD(d.H, T(0));
  Mamba2ScanBackward(Mamba2ScanFormFor(L), rows, a.S0.data(), dy.data(), carry, dxbc.data(),
                     ddt.data(), dA.data(), dD.data());
  for (int64_t h = 0; h < d.H; ++h) {
    gl.A_log[h] += dA[h] * A[h];  // A = -exp(A_log): dA/dA_log = A
    gl.D[h] += dD[h];
  }
  // dt = softplus(dt_raw + dt_bias), clamped: zero where the clamp held it.
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t h = 0; h < d.H; ++h) {
      const T x = a.zx[(hb + i) * d.Dp + d.Di + d.Cc + h] + l.dt_bias[h];
      bool pass = true;
      if (cfg.dt_clamped()) {
        const T v = Softplus(x);
        pass = v >= T(cfg.time_step_min_limit) && v <= T(cfg.time_step_max_limit);
      }
      const T draw = pass ? ddt[i * d.H + h] * Sigmoid(x) : T(0);
      dzx[i * d.Dp + d.Di + d.Cc + h] = draw;
      gl.dt_bias[h] += draw;
    }
  }
  // The conv input rows [t1 - W + 1, t1) from the later chunks: those inside this chunk join
  // its dzx, those before t0 move to the outgoing halo, rows [t0 - W + 1, t0).
  const int64_t H1 = d.W - 1;
  std::vector<T> out_halo(H1 * d.Cc, T(0));
  for (int64_t q = 0; q < H1; ++q) {
    const int64_t row = t1 - H1 + q;
    if (row < 0) continue;
    const T* src = halo + q * d.Cc;
    T* dst = row >= t0 ? &dzx[(row - t0) * d.Dp + d.Di] : &out_halo[(row - (t0 - H1)) * d.Cc];
    for (int64_t c = 0; c < d.Cc; ++c) dst[c] += src[c];
  }
  // silu, then the conv back to its input: rows of this chunk, or of the halo before it. Row
  // by row, tap by tap, over the channels (the weight gradient taken as (W, Cc) and given
  // back): every sum adds its terms in row order, as a loop over channels outermost would.
  const std::vector<T> taps = ConvTaps(l, d);
  std::vector<T> gtaps(d.W * d.Cc), dp(d.Cc);
  for (int64_t c = 0; c < d.Cc; ++c)
    for (int64_t j = 0; j < d.W; ++j) gtaps[j * d.Cc + c] = gl.conv_w[c * d.W + j];
  for (int64_t i = 0; i < L; ++i) {
    const T* pre = &a.pre[i * d.Cc];
    const T* dx = &dxbc[i * d.Cc];
    for (int64_t c = 0; c < d.Cc; ++c) {
      const T s = Sigmoid(pre[c]);
      dp[c] = dx[c] * SiluGradGivenSigmoid(pre[c], s);
      gl.conv_b[c] += dp[c];
    }
    for (int64_t j = 0; j < d.W; ++j) {
      const int64_t row = t0 + i - H1 + j;  // the input row read
      if (row < 0) continue;
      const T* x = &a.zx[(row - (t0 - hb)) * d.Dp + d.Di];
      const T* w = &taps[j * d.Cc];
      T* gw = &gtaps[j * d.Cc];
      T* dst = row >= t0 ? &dzx[(row - t0) * d.Dp + d.Di] : &out_halo[(row - (t0 - H1)) * d.Cc];
      for (int64_t c = 0; c < d.Cc; ++c) {
        gw[c] += dp[c] * x[c];
        dst[c] += dp[c] * w[c];
      }
    }
  }
  for (int64_t c = 0; c < d.Cc; ++c)
    for (int64_t j = 0; j < d.W; ++j) gl.conv_w[c * d.W + j] = gtaps[j * d.Cc + c];
  std::copy(out_halo.begin(), out_halo.end(), halo);
  const T* xn = a.xn.data() + hb * d.D;  // the chunk's own rows
  Gemm<T>(Trans::kYes, Trans::kNo, d.Dp, d.D, L, T(1), dzx.data(), d.Dp, xn, d.D, T(1),
          gl.in_proj.data(), d.D);
  cpu::AlignedVector<T>& dxn = ThreadScratch<T>(kDxn, L * d.D);
  Gemm<T>(Trans::kNo, Trans::kNo, L, d.D, d.Dp, T(1), dzx.data(), d.Dp, l.in_proj.data(), d.D,
          T(0), dxn.data(), d.D);
  cpu::RmsNormBackward(u + hb * d.D, L, d.D, l.norm.data(), a.r1.data() + hb, dxn.data(),
                       gl.norm.data(), dxn.data());
  for (int64_t i = 0; i < L * d.D; ++i) du[i] = dout[i] + dxn[i];
}

template <typename T>
void Mamba2ChunkAdjoint(const Mamba2Layer<T>& l, const Mamba2Config& cfg,
                        const Mamba2ChunkActs<T>& a, const T* dout, T* carry) {
  const Mamba2Dims d(cfg);
  const int64_t L = a.t1 - a.t0;
  cpu::AlignedVector<T>& dn = ThreadScratch<T>(kDn, L * d.Di);
  cpu::AlignedVector<T>& dy = ThreadScratch<T>(kDy, L * d.Di);
  Gemm<T>(Trans::kNo, Trans::kNo, L, d.Di, d.D, T(1), dout, d.D, l.out_proj.data(), d.Di, T(0),
          dn.data(), d.Di);
  GatedNormBackward<T>(l, d, a, dn.data(), dy.data(), nullptr, nullptr);
  const std::vector<T> A = Decay(l, d);
  const Mamba2ScanRows<T> rows{&d, L, a.dt.data(), a.xbc.data(), A.data(), l.D.data()};
  Mamba2ScanAdjoint(Mamba2ScanFormFor(L), rows, dy.data(), carry);
}

template <typename T>
void Mamba2HaloBackward(const Mamba2Layer<T>& l, const Mamba2Config& cfg, const T* u,
                        int64_t t0, const T* halo, Mamba2Layer<T>& gl, T* du) {
  const Mamba2Dims d(cfg);
  const int64_t n = std::min(d.W - 1, t0), skip = (d.W - 1) - n;  // halo rows before row 0
  if (n == 0) return;
  std::vector<T> xn(n * d.D), r1(n), dzx(n * d.Dp, T(0)), dxn(n * d.D);
  cpu::RmsNormForward(u, n, d.D, l.norm.data(), cfg.layer_norm_epsilon, xn.data(), r1.data());
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(halo + (skip + i) * d.Cc, d.Cc, &dzx[i * d.Dp + d.Di]);
  Gemm<T>(Trans::kYes, Trans::kNo, d.Dp, d.D, n, T(1), dzx.data(), d.Dp, xn.data(), d.D, T(1),
          gl.in_proj.data(), d.D);
  Gemm<T>(Trans::kNo, Trans::kNo, n, d.D, d.Dp, T(1), dzx.data(), d.Dp, l.in_proj.data(), d.D,
          T(0), dxn.data(), d.D);
  cpu::RmsNormBackward(u, n, d.D, l.norm.data(), r1.data(), dxn.data(), gl.norm.data(),
                       dxn.data());
  for (int64_t i = 0; i < n * d.D; ++i) du[i] += dxn[i];
}

#define ADJSH_INSTANTIATE(T)                                                                    \
  template void Mamba2ChunkForward<T>(const Mamba2Layer<T>&, const Mamba2Config&, const T*,     \
                                      int64_t, int64_t, T*, Mamba2ChunkActs<T>&, T*);           \
  template void Mamba2ChunkBackward<T>(const Mamba2Layer<T>&, const Mamba2Config&, const T*,    \
                                       const Mamba2ChunkActs<T>&, const T*, T*, T*,             \
                                       Mamba2Layer<T>&, T*);                                    \
  template void Mamba2ChunkAdjoint<T>(const Mamba2Layer<T>&, const Mamba2Config&,               \
                                      const Mamba2ChunkActs<T>&, const T*, T*);                 \
  template void Mamba2HaloBackward<T>(const Mamba2Layer<T>&, const Mamba2Config&, const T*,     \
                                      int64_t, const T*, Mamba2Layer<T>&, T*);
ADJSH_INSTANTIATE(float)
ADJSH_INSTANTIATE(double)
#undef ADJSH_INSTANTIATE

}  // namespace adjsh
