// Mamba-2's exact gradient (engine/mamba2_grad.h). Per layer k, with u = u^k (T, D):
//   xn = rmsnorm(u; norm)                         zx = xn in_proj^T = [z | xBC_in | dt_raw]
//   pre = causal depthwise conv(xBC_in) + bias    xbc = silu(pre) = [x | B | C]
//   dt = softplus(dt_raw + dt_bias) (clamped)     A = -exp(A_log)
//   per head h (group g = h / (H / G)): S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T,
//                                       y_t = S_t C_t + D_h x_t
//   gv = y * silu(z); n = rmsnorm per group of Di / G channels (gnorm); u^{k+1} = u + n out_proj^T
// The backward of the scan, per head, in reverse: G_t = dy_t C_t^T + exp(dt_{t+1} A) G_{t+1}
// (P, N) is dL/dS_t, from which dC_t = S_t^T dy_t, dx_t = D dy_t + dt_t G_t B_t,
// dB_t = dt_t G_t^T x_t, ddt_t = x_t^T G_t B_t + A exp(dt_t A) <G_t, S_{t-1}>.
#include "engine/mamba2_grad.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/lm_head.h"
#include "kernels/cpu/rmsnorm.h"

namespace adjsh {
namespace {

using cpu::Gemm;
using cpu::Trans;

template <typename T>
T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
template <typename T>
T Softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}

struct Dims {
  int64_t T, D, Di, H, P, G, N, W, Cc, Dp, C;  // C: the chunk of the state checkpoints
  int64_t chunks() const { return (T + C - 1) / C; }
};

Dims DimsOf(const Mamba2Config& c, int64_t T, int64_t chunk) {
  return Dims{T, c.hidden_size, c.inner(), c.num_heads, c.head_dim, c.n_groups, c.state_size,
              c.conv_kernel, c.conv_channels(), c.in_proj_rows(), std::min(chunk, T)};
}

// One layer's activations over the sequence, recomputed from its input for the backward.
template <typename T>
struct Acts {
  std::vector<T> xn, r1;  // (T, D), (T): the pre-norm
  std::vector<T> zx;      // (T, Dp): z, the conv's input, dt_raw
  std::vector<T> pre;     // (T, Cc): conv + bias
  std::vector<T> xbc;     // (T, Cc): silu(pre) = x, B, C
  std::vector<T> dt;      // (T, H)
  std::vector<T> y;       // (T, Di): the scan's output
  std::vector<T> gv;      // (T, Di): y * silu(z)
  std::vector<T> r2;      // (T, G): the gated norm's 1 / rms per group
  std::vector<T> n;       // (T, Di): the gated norm's output
  std::vector<T> states;  // (chunks, H, P, N): each head's state at each chunk's start
};

// u^{k+1} - u^k = out (T, D) of layer l on u (T, D), keeping its activations in a.
template <typename T>
void LayerForward(const Mamba2Layer<T>& l, const Mamba2Config& cfg, const Dims& d, const T* u,
                  Acts<T>& a, T* out) {
  const int64_t T_ = d.T;
  a.xn.resize(T_ * d.D), a.r1.resize(T_);
  cpu::RmsNormForward(u, T_, d.D, l.norm.data(), cfg.layer_norm_epsilon, a.xn.data(),
                      a.r1.data());
  a.zx.resize(T_ * d.Dp);
  Gemm<T>(Trans::kNo, Trans::kYes, T_, d.Dp, d.D, T(1), a.xn.data(), d.D, l.in_proj.data(), d.D,
          T(0), a.zx.data(), d.Dp);
  // The causal conv over the xBC channels (zx columns [Di, Di + Cc)), then silu.
  a.pre.resize(T_ * d.Cc), a.xbc.resize(T_ * d.Cc);
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t c = 0; c < d.Cc; ++c) {
      T acc = l.conv_b[c];
      for (int64_t j = 0; j < d.W; ++j) {
        const int64_t s = t - (d.W - 1) + j;
        if (s >= 0) acc += l.conv_w[c * d.W + j] * a.zx[s * d.Dp + d.Di + c];
      }
      a.pre[t * d.Cc + c] = acc;
      a.xbc[t * d.Cc + c] = acc * Sigmoid(acc);
    }
  }
  a.dt.resize(T_ * d.H);
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t h = 0; h < d.H; ++h) {
      T v = Softplus(a.zx[t * d.Dp + d.Di + d.Cc + h] + l.dt_bias[h]);
      if (cfg.dt_clamped())
        v = std::clamp(v, T(cfg.time_step_min_limit), T(cfg.time_step_max_limit));
      a.dt[t * d.H + h] = v;
    }
  }
  // The scan, head by head.
  const int64_t PN = d.P * d.N, rep = d.H / d.G;
  a.y.resize(T_ * d.Di);
  a.states.resize(d.chunks() * d.H * PN);
  std::vector<T> S(PN);
  for (int64_t h = 0; h < d.H; ++h) {
    const int64_t g = h / rep;
    const T A = -std::exp(l.A_log[h]);
    std::fill(S.begin(), S.end(), T(0));
    for (int64_t t = 0; t < T_; ++t) {
      if (t % d.C == 0) std::copy(S.begin(), S.end(), a.states.begin() + ((t / d.C) * d.H + h) * PN);
      const T dt = a.dt[t * d.H + h], decay = std::exp(dt * A);
      const T* x = &a.xbc[t * d.Cc + h * d.P];
      const T* B = &a.xbc[t * d.Cc + d.Di + g * d.N];
      const T* C = &a.xbc[t * d.Cc + d.Di + d.G * d.N + g * d.N];
      for (int64_t p = 0; p < d.P; ++p) {
        const T xv = dt * x[p];
        T* Sp = &S[p * d.N];
        T acc = 0;
        for (int64_t n = 0; n < d.N; ++n) {
          Sp[n] = decay * Sp[n] + xv * B[n];
          acc += Sp[n] * C[n];
        }
        a.y[t * d.Di + h * d.P + p] = acc + l.D[h] * x[p];
      }
    }
  }
  // The gated norm: gv = y * silu(z), normalised per group of M = Di / G channels.
  const int64_t M = d.Di / d.G;
  a.gv.resize(T_ * d.Di), a.r2.resize(T_ * d.G), a.n.resize(T_ * d.Di);
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t i = 0; i < d.Di; ++i) {
      const T z = a.zx[t * d.Dp + i];
      a.gv[t * d.Di + i] = a.y[t * d.Di + i] * z * Sigmoid(z);
    }
    for (int64_t j = 0; j < d.G; ++j) {
      const T* gv = &a.gv[t * d.Di + j * M];
      T ss = 0;
      for (int64_t i = 0; i < M; ++i) ss += gv[i] * gv[i];
      const T r = T(1) / std::sqrt(ss / T(M) + T(cfg.layer_norm_epsilon));
      a.r2[t * d.G + j] = r;
      for (int64_t i = 0; i < M; ++i) a.n[t * d.Di + j * M + i] = gv[i] * r * l.gnorm[j * M + i];
    }
  }
  Gemm<T>(Trans::kNo, Trans::kYes, T_, d.D, d.Di, T(1), a.n.data(), d.Di, l.out_proj.data(), d.Di,
          T(0), out, d.D);
}

// Given dout = dL/du^{k+1} (T, D): accumulates layer l's gradient into gl and writes
// du = dL/du^k (T, D) (the residual's dout plus the mixer's share).
template <typename T>
void LayerBackward(const Mamba2Layer<T>& l, const Mamba2Config& cfg, const Dims& d, const T* u,
                   const Acts<T>& a, const T* dout, Mamba2Layer<T>& gl, T* du) {
  const int64_t T_ = d.T, M = d.Di / d.G;
  std::vector<T> dn(T_ * d.Di);
  Gemm<T>(Trans::kNo, Trans::kNo, T_, d.Di, d.D, T(1), dout, d.D, l.out_proj.data(), d.Di, T(0),
          dn.data(), d.Di);
  Gemm<T>(Trans::kYes, Trans::kNo, d.D, d.Di, T_, T(1), dout, d.D, a.n.data(), d.Di, T(1),
          gl.out_proj.data(), d.Di);
  // The gated norm, back to dy and dz (dzx's z columns).
  std::vector<T> dzx(T_ * d.Dp, T(0)), dy(T_ * d.Di);
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t j = 0; j < d.G; ++j) {
      const int64_t o = t * d.Di + j * M;
      const T r = a.r2[t * d.G + j];
      T dot = 0;
      for (int64_t i = 0; i < M; ++i) {
        gl.gnorm[j * M + i] += dn[o + i] * a.gv[o + i] * r;
        dot += dn[o + i] * l.gnorm[j * M + i] * a.gv[o + i];
      }
      const T coef = r * r * r * dot / T(M);
      for (int64_t i = 0; i < M; ++i) {
        const T dg = r * dn[o + i] * l.gnorm[j * M + i] - a.gv[o + i] * coef;
        const T z = a.zx[t * d.Dp + j * M + i], s = Sigmoid(z);
        dy[o + i] = dg * z * s;
        dzx[t * d.Dp + j * M + i] = dg * a.y[o + i] * s * (T(1) + z * (T(1) - s));
      }
    }
  }
  // The scan, per head in reverse, chunk by chunk from the kept chunk-start states.
  const int64_t PN = d.P * d.N, rep = d.H / d.G;
  std::vector<T> dxbc(T_ * d.Cc, T(0)), ddt(T_ * d.H, T(0));
  std::vector<T> buf((d.C + 1) * PN), G(PN), carry(PN);
  for (int64_t h = 0; h < d.H; ++h) {
    const int64_t g = h / rep;
    const T A = -std::exp(l.A_log[h]), Dh = l.D[h];
    T dA = 0, dD = 0;
    std::fill(carry.begin(), carry.end(), T(0));
    for (int64_t c = d.chunks() - 1; c >= 0; --c) {
      const int64_t t0 = c * d.C, t1 = std::min(T_, t0 + d.C);
      std::copy_n(a.states.begin() + (c * d.H + h) * PN, PN, buf.begin());
      for (int64_t t = t0; t < t1; ++t) {  // buf[i + 1] = S_{t0 + i}
        const T dt = a.dt[t * d.H + h], decay = std::exp(dt * A);
        const T* x = &a.xbc[t * d.Cc + h * d.P];
        const T* B = &a.xbc[t * d.Cc + d.Di + g * d.N];
        const T* prev = &buf[(t - t0) * PN];
        T* next = &buf[(t - t0 + 1) * PN];
        for (int64_t p = 0; p < d.P; ++p)
          for (int64_t n = 0; n < d.N; ++n)
            next[p * d.N + n] = decay * prev[p * d.N + n] + dt * x[p] * B[n];
      }
      for (int64_t t = t1 - 1; t >= t0; --t) {
        const T dt = a.dt[t * d.H + h], decay = std::exp(dt * A);
        const T* x = &a.xbc[t * d.Cc + h * d.P];
        const T* B = &a.xbc[t * d.Cc + d.Di + g * d.N];
        const T* C = &a.xbc[t * d.Cc + d.Di + d.G * d.N + g * d.N];
        const T* dyt = &dy[t * d.Di + h * d.P];
        const T* St = &buf[(t - t0 + 1) * PN];
        const T* Sprev = &buf[(t - t0) * PN];
        T* dx = &dxbc[t * d.Cc + h * d.P];
        T* dB = &dxbc[t * d.Cc + d.Di + g * d.N];
        T* dC = &dxbc[t * d.Cc + d.Di + d.G * d.N + g * d.N];
        T xGB = 0, GS = 0;
        for (int64_t p = 0; p < d.P; ++p) {
          T GB = 0;
          for (int64_t n = 0; n < d.N; ++n) {
            const T Gv = carry[p * d.N + n] + dyt[p] * C[n];
            G[p * d.N + n] = Gv;
            dC[n] += St[p * d.N + n] * dyt[p];
            dB[n] += dt * Gv * x[p];
            GB += Gv * B[n];
            GS += Gv * Sprev[p * d.N + n];
          }
          dx[p] += Dh * dyt[p] + dt * GB;
          xGB += x[p] * GB;
          dD += dyt[p] * x[p];
        }
        ddt[t * d.H + h] += xGB + A * decay * GS;
        dA += decay * dt * GS;
        for (int64_t i = 0; i < PN; ++i) carry[i] = decay * G[i];
      }
    }
    gl.A_log[h] += dA * A;  // A = -exp(A_log): dA/dA_log = A
    gl.D[h] += dD;
  }
  // dt = softplus(dt_raw + dt_bias), clamped: zero where the clamp held it.
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t h = 0; h < d.H; ++h) {
      const T x = a.zx[t * d.Dp + d.Di + d.Cc + h] + l.dt_bias[h];
      bool pass = true;
      if (cfg.dt_clamped()) {
        const T v = Softplus(x);
        pass = v >= T(cfg.time_step_min_limit) && v <= T(cfg.time_step_max_limit);
      }
      const T draw = pass ? ddt[t * d.H + h] * Sigmoid(x) : T(0);
      dzx[t * d.Dp + d.Di + d.Cc + h] = draw;
      gl.dt_bias[h] += draw;
    }
  }
  // silu, then the conv back to its input (dzx's xBC columns).
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t c = 0; c < d.Cc; ++c) {
      const T p = a.pre[t * d.Cc + c], s = Sigmoid(p);
      const T dp = dxbc[t * d.Cc + c] * s * (T(1) + p * (T(1) - s));
      gl.conv_b[c] += dp;
      for (int64_t j = 0; j < d.W; ++j) {
        const int64_t src = t - (d.W - 1) + j;
        if (src < 0) continue;
        gl.conv_w[c * d.W + j] += dp * a.zx[src * d.Dp + d.Di + c];
        dzx[src * d.Dp + d.Di + c] += dp * l.conv_w[c * d.W + j];
      }
    }
  }
  Gemm<T>(Trans::kYes, Trans::kNo, d.Dp, d.D, T_, T(1), dzx.data(), d.Dp, a.xn.data(), d.D, T(1),
          gl.in_proj.data(), d.D);
  std::vector<T> dxn(T_ * d.D);
  Gemm<T>(Trans::kNo, Trans::kNo, T_, d.D, d.Dp, T(1), dzx.data(), d.Dp, l.in_proj.data(), d.D,
          T(0), dxn.data(), d.D);
  cpu::RmsNormBackward(u, T_, d.D, l.norm.data(), a.r1.data(), dxn.data(), gl.norm.data(),
                       dxn.data());
  for (int64_t i = 0; i < T_ * d.D; ++i) du[i] = dout[i] + dxn[i];
}

}  // namespace

template <typename T>
absl::StatusOr<Mamba2GradResult<T>> Mamba2Gradient(const Mamba2Params<T>& params,
                                                   std::span<const uint32_t> tokens,
                                                   int64_t chunk) {
  const Mamba2Config& cfg = params.config;
  const int64_t T_ = static_cast<int64_t>(tokens.size());
  if (T_ < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a gradient needs at least 2 tokens (one next-token target), got ", T_));
  }
  if (chunk < 1) return absl::InvalidArgumentError(absl::StrCat("chunk must be >= 1, got ", chunk));
  for (int64_t t = 0; t < T_; ++t) {
    if (tokens[t] >= static_cast<uint64_t>(cfg.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("token ", t, " is ", tokens[t],
                                                     ", not below vocab_size ", cfg.vocab_size));
    }
  }
  const Dims d = DimsOf(cfg, T_, chunk);
  const int64_t K = cfg.num_hidden_layers, V = cfg.vocab_size;
  // u[k]: the input of layer k; u[K] the last layer's output.
  std::vector<std::vector<T>> u(K + 1, std::vector<T>(T_ * d.D));
  for (int64_t t = 0; t < T_; ++t)
    std::copy_n(params.embed.begin() + tokens[t] * d.D, d.D, u[0].begin() + t * d.D);
  Acts<T> acts;
  for (int64_t k = 0; k < K; ++k) {
    LayerForward(params.layers[k], cfg, d, u[k].data(), acts, u[k + 1].data());
    for (int64_t i = 0; i < T_ * d.D; ++i) u[k + 1][i] += u[k][i];
  }
  Mamba2GradResult<T> r;
  r.grad = ZeroMamba2Params<T>(cfg);
  r.targets = T_ - 1;
  // The head, 64 rows at a time: dL/du^K into du, dE += dlogits^T nf in row-block order.
  std::vector<T> du(T_ * d.D), ddu(T_ * d.D);
  std::vector<T>& dhead = cfg.tie_word_embeddings ? r.grad.embed : r.grad.lm_head;
  constexpr int64_t kRows = 64;
  std::vector<T> dlogits(kRows * V), nf(kRows * d.D);
  std::vector<int64_t> targets(kRows);
  double loss = 0;
  for (int64_t t0 = 0; t0 < T_; t0 += kRows) {
    const int64_t m = std::min(kRows, T_ - t0);
    for (int64_t i = 0; i < m; ++i)
      targets[i] = t0 + i + 1 < T_ ? static_cast<int64_t>(tokens[t0 + i + 1]) : int64_t{-1};
    cpu::LmHeadArgs<T> args;
    args.M = m, args.D = d.D, args.V = V, args.eps = cfg.layer_norm_epsilon;
    args.E = params.head().data(), args.w_f = params.norm_f.data();
    args.u = u[K].data() + t0 * d.D, args.targets = targets.data();
    args.scale = T(1) / T(r.targets);
    loss += cpu::LmHeadForwardBackward(args, du.data() + t0 * d.D, dlogits.data(), nf.data(),
                                       r.grad.norm_f.data());
    Gemm<T>(Trans::kYes, Trans::kNo, V, d.D, m, T(1), dlogits.data(), V, nf.data(), d.D, T(1),
            dhead.data(), d.D);
  }
  r.loss = loss / static_cast<double>(r.targets);
  std::vector<T> scratch(T_ * d.D);
  for (int64_t k = K - 1; k >= 0; --k) {
    LayerForward(params.layers[k], cfg, d, u[k].data(), acts, scratch.data());
    LayerBackward(params.layers[k], cfg, d, u[k].data(), acts, du.data(), r.grad.layers[k],
                  ddu.data());
    std::swap(du, ddu);
  }
  for (int64_t t = 0; t < T_; ++t) {
    T* row = r.grad.embed.data() + tokens[t] * d.D;
    for (int64_t i = 0; i < d.D; ++i) row[i] += du[t * d.D + i];
  }
  return r;
}

template absl::StatusOr<Mamba2GradResult<float>> Mamba2Gradient<float>(
    const Mamba2Params<float>&, std::span<const uint32_t>, int64_t);
template absl::StatusOr<Mamba2GradResult<double>> Mamba2Gradient<double>(
    const Mamba2Params<double>&, std::span<const uint32_t>, int64_t);

}  // namespace adjsh
