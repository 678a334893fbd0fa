// The block form of the Mamba-2 scan (kernels/cpu/mamba2_scan.h; docs/MATH.md "The block form").
// The chunk's rows are cut into blocks of Q <= kMamba2ScanBlock rows. With e_t = exp(dt_t A) the
// per-row decay, E_ij = prod_{j<t<=i} e_t (i >= j) and ec_i = prod_{t<=i} e_t inside a block
// (rows counted from its start), a head's block is
//   y_i   = sum_{j<=i} E_ij dt_j (C_i . B_j) x_j + ec_i S0 C_i + D x_i
//   S_end = ec_last S0 + sum_j E_last,j dt_j x_j B_j^T
// so that C B^T (once per group), the masked (Q, Q) times x, C S0^T and the state update are
// GEMMs. The backward differentiates these four terms; the decay's gradient dL/da_t
// (a_t = dt_t A) gathers every factor that holds e_t:
//   da_t = sum_{i>=t, j<t} W_ij + sum_{i>=t} s_i + <K, ec_last S0> + sum_{j<t} q_j
// with W_ij = E_ij dt_j (C_i . B_j)(dy_i . x_j), s_i = ec_i dy_i . S0 C_i, K = dL/dS_end and
// q_j = E_last,j dt_j x_j . K B_j. Every E is built by one function (Decays), row by row, so
// that a factor has the same bits in the forward, the states-only sweep and the backward.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/mamba2_scan_blocks.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/rmsnorm.h"

namespace adjsh::mamba2_blocks {
namespace {

using cpu::Gemm;
using cpu::RowDot;
using cpu::Trans;

// Ex (Q, Q + 1) for head h's block of rows [b0, b0 + Q): Ex[i][0] = ec_i, Ex[i][j + 1] = E_ij for
// j <= i (1 on the diagonal) and 0 above it.
template <typename T>
void Decays(const Mamba2ScanRows<T>& r, int64_t h, int64_t b0, int64_t Q, T* Ex) {
  const int64_t H = r.d->H, W = Q + 1;
  for (int64_t i = 0; i < Q; ++i) {
    const T e = std::exp(r.dt[(b0 + i) * H + h] * r.A[h]);
    T* row = Ex + i * W;
    if (i == 0) {
      row[0] = e;
    } else {
      for (int64_t c = 0; c <= i; ++c) row[c] = row[c - W] * e;
    }
    row[i + 1] = T(1);
    std::fill(row + i + 2, row + W, T(0));
  }
}

// The block's rows of one head and its group, as pointers into the chunk's rows.
template <typename T>
struct BlockRows {
  int64_t b0, Q, h;
  const T* x;  // (Q, P), rows of Cc
  const T* B;  // (Q, N), rows of Cc
  const T* C;  // (Q, N), rows of Cc
  const T* dt(const Mamba2ScanRows<T>& r, int64_t i) const { return &r.dt[(b0 + i) * r.d->H + h]; }
};

template <typename T>
BlockRows<T> RowsOf(const Mamba2ScanRows<T>& r, int64_t b0, int64_t Q, int64_t h) {
  const Mamba2Dims& d = *r.d;
  const int64_t g = h / (d.H / d.G);
  const T* row = r.xbc + b0 * d.Cc;
  return {b0, Q, h, row + h * d.P, row + d.Di + g * d.N, row + d.Di + d.G * d.N + g * d.N};
}

// S (P, N) from before the block to after it; Xs (Q, P) is scratch.
template <typename T>
void StateUpdate(const Mamba2ScanRows<T>& r, const BlockRows<T>& b, const T* Ex, T* Xs, T* S) {
  const Mamba2Dims& d = *r.d;
  const T* last = Ex + (b.Q - 1) * (b.Q + 1);
  for (int64_t j = 0; j < b.Q; ++j) {
    const T w = last[j + 1] * *b.dt(r, j);
    for (int64_t p = 0; p < d.P; ++p) Xs[j * d.P + p] = w * b.x[j * d.Cc + p];
  }
  for (int64_t q = 0; q < d.P * d.N; ++q) S[q] *= last[0];
  Gemm<T>(Trans::kYes, Trans::kNo, d.P, d.N, b.Q, T(1), Xs, d.P, b.B, d.Cc, T(1), S, d.N);
}

// The block starts' states: Sb[k] (H, P, N) before block k, from S0 before the chunk.
template <typename T>
std::vector<T> BlockStarts(const Mamba2ScanRows<T>& r, const T* S0) {
  const Mamba2Dims& d = *r.d;
  const int64_t Qm = kMamba2ScanBlock, nb = (r.L + Qm - 1) / Qm, HPN = d.H * d.P * d.N;
  std::vector<T> Sb(nb * HPN), Ex(Qm * (Qm + 1)), Xs(Qm * d.P);
  std::copy_n(S0, HPN, Sb.begin());
  for (int64_t k = 1; k < nb; ++k) {
    std::copy_n(&Sb[(k - 1) * HPN], HPN, &Sb[k * HPN]);
    for (int64_t h = 0; h < d.H; ++h) {
      const BlockRows<T> b = RowsOf(r, (k - 1) * Qm, Qm, h);
      Decays(r, h, b.b0, b.Q, Ex.data());
      StateUpdate(r, b, Ex.data(), Xs.data(), &Sb[k * HPN + h * d.P * d.N]);
    }
  }
  return Sb;
}

}  // namespace

template <typename T>
void Forward(const Mamba2ScanRows<T>& r, T* S, T* y) {
  const Mamba2Dims& d = *r.d;
  const int64_t Qm = kMamba2ScanBlock, PN = d.P * d.N, rep = d.H / d.G;
  std::vector<T> Ex(Qm * (Qm + 1)), CB(Qm * Qm), M(Qm * Qm), Ce(Qm * d.N), Xs(Qm * d.P);
  for (int64_t b0 = 0; b0 < r.L; b0 += Qm) {
    const int64_t Q = std::min(Qm, r.L - b0), W = Q + 1;
    for (int64_t g = 0; g < d.G; ++g) {
      const BlockRows<T> first = RowsOf(r, b0, Q, g * rep);
      if (y) {
        Gemm<T>(Trans::kNo, Trans::kYes, Q, Q, d.N, T(1), first.C, d.Cc, first.B, d.Cc, T(0),
                CB.data(), Q);
      }
      for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
        const BlockRows<T> b = RowsOf(r, b0, Q, h);
        Decays(r, h, b0, Q, Ex.data());
        T* Sh = S + h * PN;
        if (y) {
          for (int64_t i = 0; i < Q; ++i)
            for (int64_t j = 0; j < Q; ++j)
              M[i * Q + j] = j <= i ? CB[i * Q + j] * Ex[i * W + j + 1] * *b.dt(r, j) : T(0);
          T* yh = y + b0 * d.Di + h * d.P;
          Gemm<T>(Trans::kNo, Trans::kNo, Q, d.P, Q, T(1), M.data(), Q, b.x, d.Cc, T(0), yh,
                  d.Di);
          for (int64_t i = 0; i < Q; ++i)
            for (int64_t n = 0; n < d.N; ++n) Ce[i * d.N + n] = Ex[i * W] * b.C[i * d.Cc + n];
          Gemm<T>(Trans::kNo, Trans::kYes, Q, d.P, d.N, T(1), Ce.data(), d.N, Sh, d.N, T(1), yh,
                  d.Di);
          for (int64_t i = 0; i < Q; ++i)
            for (int64_t p = 0; p < d.P; ++p) yh[i * d.Di + p] += r.Dskip[h] * b.x[i * d.Cc + p];
        }
        StateUpdate(r, b, Ex.data(), Xs.data(), Sh);
      }
    }
  }
}

template <typename T>
void Backward(const Mamba2ScanRows<T>& r, const T* S0, const T* dy, T* carry, T* dxbc, T* ddt,
              T* dA, T* dD) {
  const Mamba2Dims& d = *r.d;
  const int64_t Qm = kMamba2ScanBlock, PN = d.P * d.N, rep = d.H / d.G;
  const int64_t nb = (r.L + Qm - 1) / Qm;
  const std::vector<T> Sb = BlockStarts(r, S0);
  std::vector<T> Ex(Qm * (Qm + 1)), CB(Qm * Qm), DX(Qm * Qm), R(Qm * Qm), U(Qm * Qm);
  std::vector<T> V(Qm * d.P), Z(Qm * d.N), Bs(Qm * d.N), Xs(Qm * d.P), dYe(Qm * d.P);
  std::vector<T> rows(Qm), cols(Qm), s(Qm), q(Qm), direct(Qm), da(Qm);
  for (int64_t k = nb - 1; k >= 0; --k) {
    const int64_t b0 = k * Qm, Q = std::min(Qm, r.L - b0), W = Q + 1;
    for (int64_t g = 0; g < d.G; ++g) {
      const BlockRows<T> first = RowsOf(r, b0, Q, g * rep);
      T* dB = dxbc + b0 * d.Cc + d.Di + g * d.N;
      T* dC = dxbc + b0 * d.Cc + d.Di + d.G * d.N + g * d.N;
      Gemm<T>(Trans::kNo, Trans::kYes, Q, Q, d.N, T(1), first.C, d.Cc, first.B, d.Cc, T(0),
              CB.data(), Q);
      for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
        const BlockRows<T> b = RowsOf(r, b0, Q, h);
        Decays(r, h, b0, Q, Ex.data());
        const T* last = &Ex[(Q - 1) * W];
        const T* S0b = &Sb[k * d.H * PN + h * PN];
        const T* dY = dy + b0 * d.Di + h * d.P;
        T* dX = dxbc + b0 * d.Cc + h * d.P;
        T* K = carry + h * PN;
        // The block's own term: DX = dY x^T, R = E o dt_j o DX, U = E o C B^T; W = R o C B^T
        // off the diagonal, summed by rows and by columns for the decay's gradient.
        Gemm<T>(Trans::kNo, Trans::kYes, Q, Q, d.P, T(1), dY, d.Di, b.x, d.Cc, T(0), DX.data(),
                Q);
        std::fill(cols.begin(), cols.end(), T(0));
        for (int64_t i = 0; i < Q; ++i) {
          T row = 0;
          for (int64_t j = 0; j < Q; ++j) {
            const int64_t o = i * Q + j;
            if (j > i) {
              R[o] = U[o] = T(0);
              continue;
            }
            const T e = Ex[i * W + j + 1];
            R[o] = e * *b.dt(r, j) * DX[o];
            U[o] = e * CB[o];
            if (j == i) continue;
            const T w = R[o] * CB[o];
            row += w;
            cols[j] += w;
          }
          rows[i] = row;
        }
        Gemm<T>(Trans::kNo, Trans::kNo, Q, d.N, Q, T(1), R.data(), Q, b.B, d.Cc, T(1), dC, d.Cc);
        Gemm<T>(Trans::kYes, Trans::kNo, Q, d.N, Q, T(1), R.data(), Q, b.C, d.Cc, T(1), dB,
                d.Cc);
        // The state after the block: V = Bs K^T (Bs_j = E_last,j B_j) is dL/d(dt_j x_j) there.
        for (int64_t j = 0; j < Q; ++j)
          for (int64_t n = 0; n < d.N; ++n) Bs[j * d.N + n] = last[j + 1] * b.B[j * d.Cc + n];
        Gemm<T>(Trans::kNo, Trans::kYes, Q, d.P, d.N, T(1), Bs.data(), d.N, K, d.N, T(0),
                V.data(), d.P);
        for (int64_t j = 0; j < Q; ++j)
          q[j] = *b.dt(r, j) * RowDot(b.x + j * d.Cc, &V[j * d.P], d.P);
        Gemm<T>(Trans::kYes, Trans::kNo, Q, d.P, Q, T(1), U.data(), Q, dY, d.Di, T(1), V.data(),
                d.P);
        T dDh = 0;
        for (int64_t j = 0; j < Q; ++j) {
          const T dt = *b.dt(r, j);
          for (int64_t p = 0; p < d.P; ++p)
            dX[j * d.Cc + p] += r.Dskip[h] * dY[j * d.Di + p] + dt * V[j * d.P + p];
          direct[j] = RowDot(b.x + j * d.Cc, &V[j * d.P], d.P);
          dDh += RowDot(dY + j * d.Di, b.x + j * d.Cc, d.P);
        }
        dD[h] += dDh;
        // The state before the block: Z = dYe S0 (dYe_i = ec_i dy_i) is its part of dC.
        for (int64_t i = 0; i < Q; ++i)
          for (int64_t p = 0; p < d.P; ++p) dYe[i * d.P + p] = Ex[i * W] * dY[i * d.Di + p];
        Gemm<T>(Trans::kNo, Trans::kNo, Q, d.N, d.P, T(1), dYe.data(), d.P, S0b, d.N, T(0),
                Z.data(), d.N);
        for (int64_t i = 0; i < Q; ++i) {
          s[i] = RowDot(b.C + i * d.Cc, &Z[i * d.N], d.N);
          for (int64_t n = 0; n < d.N; ++n) dC[i * d.Cc + n] += Z[i * d.N + n];
        }
        for (int64_t j = 0; j < Q; ++j) {
          const T w = last[j + 1] * *b.dt(r, j);
          for (int64_t p = 0; p < d.P; ++p) Xs[j * d.P + p] = w * b.x[j * d.Cc + p];
        }
        Gemm<T>(Trans::kNo, Trans::kNo, Q, d.N, d.P, T(1), Xs.data(), d.P, K, d.N, T(1), dB,
                d.Cc);
        // The decay's gradient (the header's da_t), then dt's and A's.
        const T KS0 = last[0] * RowDot(K, S0b, PN);
        T suffix = 0, prefix = 0, dAh = 0;
        for (int64_t t = Q - 1; t >= 0; --t) da[t] = suffix += rows[t] - cols[t] + s[t];
        for (int64_t t = 0; t < Q; ++t) {
          const T dat = da[t] + KS0 + prefix, dt = *b.dt(r, t);
          prefix += q[t];
          ddt[(b0 + t) * d.H + h] += direct[t] + r.A[h] * dat;
          dAh += dt * dat;
        }
        dA[h] += dAh;
        // dL/dS0 = ec_last K + dYe^T C.
        for (int64_t o = 0; o < PN; ++o) K[o] *= last[0];
        Gemm<T>(Trans::kYes, Trans::kNo, d.P, d.N, Q, T(1), dYe.data(), d.P, b.C, d.Cc, T(1), K,
                d.N);
      }
    }
  }
}

template <typename T>
void Adjoint(const Mamba2ScanRows<T>& r, const T* dy, T* carry) {
  const Mamba2Dims& d = *r.d;
  const int64_t Qm = kMamba2ScanBlock, PN = d.P * d.N, nb = (r.L + Qm - 1) / Qm;
  std::vector<T> Ex(Qm * (Qm + 1)), dYe(Qm * d.P);
  for (int64_t k = nb - 1; k >= 0; --k) {
    const int64_t b0 = k * Qm, Q = std::min(Qm, r.L - b0), W = Q + 1;
    for (int64_t h = 0; h < d.H; ++h) {
      const BlockRows<T> b = RowsOf(r, b0, Q, h);
      Decays(r, h, b0, Q, Ex.data());
      const T* dY = dy + b0 * d.Di + h * d.P;
      for (int64_t i = 0; i < Q; ++i)
        for (int64_t p = 0; p < d.P; ++p) dYe[i * d.P + p] = Ex[i * W] * dY[i * d.Di + p];
      T* K = carry + h * PN;
      const T ecl = Ex[(Q - 1) * W];
      for (int64_t o = 0; o < PN; ++o) K[o] *= ecl;
      Gemm<T>(Trans::kYes, Trans::kNo, d.P, d.N, Q, T(1), dYe.data(), d.P, b.C, d.Cc, T(1), K,
              d.N);
    }
  }
}

#define ADJSH_INSTANTIATE(T)                                                                   \
  template void Forward<T>(const Mamba2ScanRows<T>&, T*, T*);                                  \
  template void Backward<T>(const Mamba2ScanRows<T>&, const T*, const T*, T*, T*, T*, T*, T*); \
  template void Adjoint<T>(const Mamba2ScanRows<T>&, const T*, T*);
ADJSH_INSTANTIATE(float)
ADJSH_INSTANTIATE(double)
#undef ADJSH_INSTANTIATE

}  // namespace adjsh::mamba2_blocks
