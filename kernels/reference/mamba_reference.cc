// Straight-line transcription of docs/MATH.md "Forward" and of the chain rule (backward), with
// every intermediate kept for the whole sequence. Shapes in comments, outermost first.
#include "kernels/reference/mamba_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace adjsh::reference {
namespace {

template <typename T>
T Sig(T x) { return T(1) / (T(1) + std::exp(-x)); }

// Everything one layer keeps (T tokens).
template <typename T>
struct LayerActs {
  std::vector<T> u, r, n, x, z, c, xc, d, B, C, dtpre, dt, a, h, y, o;
};

template <typename T>
class Reference {
 public:
  Reference(const ModelParams<T>& p, std::span<const uint32_t> tokens, int64_t window)
      : p_(p), cfg_(p.config), tok_(tokens), window_(window), T_(int64_t(tokens.size())),
        D_(cfg_.hidden_size), Di_(cfg_.inner()), N_(cfg_.state_size),
        R_(cfg_.time_step_rank), W_(cfg_.conv_kernel), V_(cfg_.vocab_size) {}

  ReferenceResult<T> Run() {
    ReferenceResult<T> res;
    res.grad = ZeroParams<T>(cfg_);
    std::vector<T> u(T_ * D_);
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t d = 0; d < D_; ++d) u[t * D_ + d] = p_.embed[tok_[t] * D_ + d];
    acts_.resize(cfg_.num_hidden_layers);
    for (size_t k = 0; k < acts_.size(); ++k) u = LayerForward(p_.layers[k], u, acts_[k]);
    std::vector<T> g = HeadForwardBackward(u, res);
    for (int64_t k = int64_t(acts_.size()) - 1; k >= 0; --k)
      g = LayerBackward(p_.layers[k], acts_[k], g, res.grad.layers[k]);
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t d = 0; d < D_; ++d) res.grad.embed[tok_[t] * D_ + d] += g[t * D_ + d];
    return res;
  }

 private:
  std::vector<T> LayerForward(const LayerParams<T>& L, const std::vector<T>& u, LayerActs<T>& s) {
    s.u = u;
    s.r.assign(T_, 0), s.n.assign(T_ * D_, 0);
    s.x.assign(T_ * Di_, 0), s.z.assign(T_ * Di_, 0), s.c.assign(T_ * Di_, 0);
    s.xc.assign(T_ * Di_, 0), s.d.assign(T_ * R_, 0), s.B.assign(T_ * N_, 0);
    s.C.assign(T_ * N_, 0), s.dtpre.assign(T_ * Di_, 0), s.dt.assign(T_ * Di_, 0);
    s.a.assign(T_ * Di_ * N_, 0), s.h.assign(T_ * Di_ * N_, 0);
    s.y.assign(T_ * Di_, 0), s.o.assign(T_ * Di_, 0);
    std::vector<T> out(u);
    for (int64_t t = 0; t < T_; ++t) {
      T ms = 0;
      for (int64_t d = 0; d < D_; ++d) ms += u[t * D_ + d] * u[t * D_ + d];
      s.r[t] = T(1) / std::sqrt(ms / T(D_) + T(cfg_.layer_norm_epsilon));
      for (int64_t d = 0; d < D_; ++d) s.n[t * D_ + d] = u[t * D_ + d] * s.r[t] * L.norm[d];
      for (int64_t j = 0; j < 2 * Di_; ++j) {  // [x; z] = W_in n
        T acc = 0;
        for (int64_t d = 0; d < D_; ++d) acc += L.in_proj[j * D_ + d] * s.n[t * D_ + d];
        (j < Di_ ? s.x[t * Di_ + j] : s.z[t * Di_ + j - Di_]) = acc;
      }
    }
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t i = 0; i < Di_; ++i) {
        T acc = L.conv_b[i];
        for (int64_t j = 0; j < W_; ++j) {
          const int64_t src = t - W_ + 1 + j;
          if (src >= 0) acc += L.conv_w[i * W_ + j] * s.x[src * Di_ + i];
        }
        s.c[t * Di_ + i] = acc;
        s.xc[t * Di_ + i] = acc * Sig(acc);
      }
      for (int64_t e = 0; e < R_ + 2 * N_; ++e) {  // [d; B; C] = W_x x'
        T acc = 0;
        for (int64_t i = 0; i < Di_; ++i) acc += L.x_proj[e * Di_ + i] * s.xc[t * Di_ + i];
        if (e < R_) s.d[t * R_ + e] = acc;
        else if (e < R_ + N_) s.B[t * N_ + e - R_] = acc;
        else s.C[t * N_ + e - R_ - N_] = acc;
      }
      for (int64_t i = 0; i < Di_; ++i) {
        T acc = L.dt_b[i];
        for (int64_t q = 0; q < R_; ++q) acc += L.dt_w[i * R_ + q] * s.d[t * R_ + q];
        s.dtpre[t * Di_ + i] = acc;
        s.dt[t * Di_ + i] = acc > T(20) ? acc : std::log1p(std::exp(acc));
      }
      for (int64_t i = 0; i < Di_; ++i) {
        T yi = 0;
        for (int64_t n = 0; n < N_; ++n) {
          const int64_t q = (t * Di_ + i) * N_ + n;
          const T A = -std::exp(L.A_log[i * N_ + n]);
          s.a[q] = std::exp(s.dt[t * Di_ + i] * A);
          const T prev = t > 0 ? s.h[q - Di_ * N_] : T(0);
          s.h[q] = s.a[q] * prev + s.dt[t * Di_ + i] * s.B[t * N_ + n] * s.xc[t * Di_ + i];
          yi += s.h[q] * s.C[t * N_ + n];
        }
        s.y[t * Di_ + i] = yi + L.Dskip[i] * s.xc[t * Di_ + i];
        const T zi = s.z[t * Di_ + i];
        s.o[t * Di_ + i] = s.y[t * Di_ + i] * zi * Sig(zi);
      }
      for (int64_t d = 0; d < D_; ++d) {
        T acc = 0;
        for (int64_t i = 0; i < Di_; ++i) acc += L.out_proj[d * Di_ + i] * s.o[t * Di_ + i];
        out[t * D_ + d] += acc;
      }
    }
    return out;
  }

  // Loss over t < T - 1; returns dL/du^{K+1}.
  std::vector<T> HeadForwardBackward(const std::vector<T>& u, ReferenceResult<T>& res) {
    std::vector<T> g(T_ * D_, 0), nf(D_), logits(V_), dnf(D_);
    double loss = 0;
    const T scale = T(1) / T(T_ - 1);
    for (int64_t t = 0; t + 1 < T_; ++t) {
      T ms = 0;
      for (int64_t d = 0; d < D_; ++d) ms += u[t * D_ + d] * u[t * D_ + d];
      const T r = T(1) / std::sqrt(ms / T(D_) + T(cfg_.layer_norm_epsilon));
      for (int64_t d = 0; d < D_; ++d) nf[d] = u[t * D_ + d] * r * p_.norm_f[d];
      T mx = -INFINITY;
      for (int64_t v = 0; v < V_; ++v) {
        T acc = 0;
        for (int64_t d = 0; d < D_; ++d) acc += p_.head()[v * D_ + d] * nf[d];
        logits[v] = acc;
        mx = std::max(mx, acc);
      }
      T sum = 0;
      for (int64_t v = 0; v < V_; ++v) sum += std::exp(logits[v] - mx);
      const int64_t target = tok_[t + 1];
      loss += double(std::log(sum) + mx - logits[target]);
      std::fill(dnf.begin(), dnf.end(), T(0));
      for (int64_t v = 0; v < V_; ++v) {
        const T dl = scale * (std::exp(logits[v] - mx) / sum - (v == target ? T(1) : T(0)));
        for (int64_t d = 0; d < D_; ++d) {
          res.grad.head()[v * D_ + d] += dl * nf[d];
          dnf[d] += dl * p_.head()[v * D_ + d];
        }
      }
      T dot = 0;
      for (int64_t d = 0; d < D_; ++d) {
        res.grad.norm_f[d] += dnf[d] * u[t * D_ + d] * r;
        dot += dnf[d] * p_.norm_f[d] * u[t * D_ + d];
      }
      for (int64_t d = 0; d < D_; ++d)
        g[t * D_ + d] = r * dnf[d] * p_.norm_f[d] - u[t * D_ + d] * r * r * r * dot / T(D_);
    }
    res.loss = loss / double(T_ - 1);
    return g;
  }

  // The adjoint of the scan for channel i, state n: exact reverse recursion or the window sum.
  std::vector<T> Lambda(const LayerActs<T>& s, const std::vector<T>& dy) const {
    std::vector<T> lam(T_ * Di_ * N_, 0);
    for (int64_t i = 0; i < Di_; ++i)
      for (int64_t n = 0; n < N_; ++n)
        for (int64_t t = T_ - 1; t >= 0; --t) {
          const int64_t q = (t * Di_ + i) * N_ + n;
          if (window_ == 0) {
            const T next = t + 1 < T_ ? s.a[q + Di_ * N_] * lam[q + Di_ * N_] : T(0);
            lam[q] = dy[t * Di_ + i] * s.C[t * N_ + n] + next;
          } else {
            T prod = 1, acc = 0;
            for (int64_t u = t; u < std::min(T_, t + window_); ++u) {
              if (u > t) prod *= s.a[(u * Di_ + i) * N_ + n];
              acc += prod * dy[u * Di_ + i] * s.C[u * N_ + n];
            }
            lam[q] = acc;
          }
        }
    return lam;
  }

  std::vector<T> LayerBackward(const LayerParams<T>& L, const LayerActs<T>& s,
                               const std::vector<T>& g, LayerParams<T>& G) {
    std::vector<T> dy(T_ * Di_), dz(T_ * Di_), dxc(T_ * Di_, 0), ddt(T_ * Di_, 0);
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t i = 0; i < Di_; ++i) {
        T d_o = 0;
        for (int64_t d = 0; d < D_; ++d) {
          d_o += g[t * D_ + d] * L.out_proj[d * Di_ + i];
          G.out_proj[d * Di_ + i] += g[t * D_ + d] * s.o[t * Di_ + i];
        }
        const T zi = s.z[t * Di_ + i], sg = Sig(zi);
        dy[t * Di_ + i] = d_o * zi * sg;
        dz[t * Di_ + i] = d_o * s.y[t * Di_ + i] * sg * (T(1) + zi * (T(1) - sg));
      }
    const std::vector<T> lam = Lambda(s, dy);
    std::vector<T> ddbc(T_ * (R_ + 2 * N_), 0);  // [dd | dB | dC]
    const int64_t Q = R_ + 2 * N_;
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t i = 0; i < Di_; ++i) {
        const int64_t ti = t * Di_ + i;
        for (int64_t n = 0; n < N_; ++n) {
          const int64_t q = ti * N_ + n;
          const T A = -std::exp(L.A_log[i * N_ + n]);
          const T prev = t > 0 ? s.h[q - Di_ * N_] : T(0);
          ddbc[t * Q + R_ + N_ + n] += dy[ti] * s.h[q];                 // dC
          const T da = lam[q] * prev;                                   // dL/da
          ddt[ti] += da * s.a[q] * A;
          G.A_log[i * N_ + n] += da * s.a[q] * s.dt[ti] * A;           // through A = -exp(A_log)
          ddt[ti] += lam[q] * s.B[t * N_ + n] * s.xc[ti];
          ddbc[t * Q + R_ + n] += lam[q] * s.dt[ti] * s.xc[ti];         // dB
          dxc[ti] += lam[q] * s.dt[ti] * s.B[t * N_ + n];
        }
        dxc[ti] += dy[ti] * L.Dskip[i];
        G.Dskip[i] += dy[ti] * s.xc[ti];
      }
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t i = 0; i < Di_; ++i) {
        const int64_t ti = t * Di_ + i;
        const T dpre = ddt[ti] * Sig(s.dtpre[ti]);
        G.dt_b[i] += dpre;
        for (int64_t q = 0; q < R_; ++q) {
          G.dt_w[i * R_ + q] += dpre * s.d[t * R_ + q];
          ddbc[t * Q + q] += dpre * L.dt_w[i * R_ + q];
        }
      }
      for (int64_t e = 0; e < Q; ++e)
        for (int64_t i = 0; i < Di_; ++i) {
          G.x_proj[e * Di_ + i] += ddbc[t * Q + e] * s.xc[t * Di_ + i];
          dxc[t * Di_ + i] += ddbc[t * Q + e] * L.x_proj[e * Di_ + i];
        }
    }
    std::vector<T> dx(T_ * Di_, 0);
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t i = 0; i < Di_; ++i) {
        const T c = s.c[t * Di_ + i], sg = Sig(c);
        const T dc = dxc[t * Di_ + i] * sg * (T(1) + c * (T(1) - sg));
        G.conv_b[i] += dc;
        for (int64_t j = 0; j < W_; ++j) {
          const int64_t src = t - W_ + 1 + j;
          if (src < 0) continue;
          G.conv_w[i * W_ + j] += dc * s.x[src * Di_ + i];
          dx[src * Di_ + i] += L.conv_w[i * W_ + j] * dc;
        }
      }
    std::vector<T> du(g);
    std::vector<T> dn(D_);
    for (int64_t t = 0; t < T_; ++t) {
      std::fill(dn.begin(), dn.end(), T(0));
      for (int64_t j = 0; j < 2 * Di_; ++j) {
        const T dj = j < Di_ ? dx[t * Di_ + j] : dz[t * Di_ + j - Di_];
        for (int64_t d = 0; d < D_; ++d) {
          G.in_proj[j * D_ + d] += dj * s.n[t * D_ + d];
          dn[d] += dj * L.in_proj[j * D_ + d];
        }
      }
      const T r = s.r[t];
      T dot = 0;
      for (int64_t d = 0; d < D_; ++d) {
        G.norm[d] += dn[d] * s.u[t * D_ + d] * r;
        dot += dn[d] * L.norm[d] * s.u[t * D_ + d];
      }
      for (int64_t d = 0; d < D_; ++d)
        du[t * D_ + d] += r * dn[d] * L.norm[d] - s.u[t * D_ + d] * r * r * r * dot / T(D_);
    }
    return du;
  }

  const ModelParams<T>& p_;
  const MambaConfig& cfg_;
  std::span<const uint32_t> tok_;
  const int64_t window_, T_, D_, Di_, N_, R_, W_, V_;
  std::vector<LayerActs<T>> acts_;  // every layer's activations, kept as backprop does
};

}  // namespace

template <typename T>
ReferenceResult<T> ReferenceGradient(const ModelParams<T>& params, std::span<const uint32_t> tokens,
                                     int64_t window) {
  return Reference<T>(params, tokens, window).Run();
}

template ReferenceResult<float> ReferenceGradient<float>(const ModelParams<float>&,
                                                         std::span<const uint32_t>, int64_t);
template ReferenceResult<double> ReferenceGradient<double>(const ModelParams<double>&,
                                                           std::span<const uint32_t>, int64_t);

}  // namespace adjsh::reference
