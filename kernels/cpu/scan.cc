// The CPU selective scan and its adjoint, channel by channel (see scan.h for the equations).
// Inner loops run over the N state lanes of one channel and vectorise; reductions over N are
// kept in separate loops so that the element-wise ones stay vectorisable without fast-math.
// Fused multiply-adds are written as MulAdd (math.h), never left to the compiler, so a loop's
// vector body and its scalar copies round identically. The sums over N (acc, s_a, s_b) stay
// plain adds: under the simd pragma GCC vectorises them as lane-wise partial sums, an order
// fixed by N and the vector width (no peeling for alignment: kernels/CMakeLists.txt), not by
// addresses.
#include "kernels/cpu/scan.h"

#include <algorithm>

#include "kernels/cpu/math.h"

// The lane loops below run over the N states of one channel: independent, so vectorised
// (OpenMP SIMD pragmas only, -fopenmp-simd: no OpenMP runtime). Without the pragma GCC fully
// unrolls a fixed 16-lane loop into scalar code before its loop vectoriser sees it.
#define ADJSH_LANES _Pragma("omp simd")

namespace adjsh::cpu {

namespace {

// Every kernel below is compiled twice: for kN = 16 (Mamba's usual state size: the lane loops
// become two fixed-width vector operations with no remainder) and for kN = 0 (any N at run time).
template <typename T, int kN>
void ForwardImpl(const ScanInputs<T>& in, int64_t i, int64_t rows, const T* h0, T d_skip,
                 T* h_end, T* y) {
  const int64_t N = kN ? kN : in.N, Di = in.Di;
  const T* __restrict A = in.A + i * N;
  T* __restrict h = h_end;  // the running state lives in the output
  ADJSH_LANES
  for (int64_t n = 0; n < N; ++n) h[n] = h0 ? h0[n] : T(0);
  for (int64_t t = 0; t < rows; ++t) {
    const T dt = in.dt[t * Di + i], x = in.xc[t * Di + i], dtx = dt * x;
    const T* __restrict B = in.B + t * in.bc_stride;
    ADJSH_LANES
    for (int64_t n = 0; n < N; ++n) h[n] = MulAdd(Exp<T>(dt * A[n]), h[n], dtx * B[n]);
    if (y) {
      const T* __restrict C = in.C + t * in.bc_stride;
      T acc = 0;
      ADJSH_LANES
      for (int64_t n = 0; n < N; ++n) acc += h[n] * C[n];
      y[t * Di + i] = MulAdd(d_skip, x, acc);
    }
  }
}

template <typename T, int kN>
void AdjointSummaryImpl(const ScanInputs<T>& in, int64_t i, int64_t len, const T* ybar, T* m) {
  const int64_t N = kN ? kN : in.N, Di = in.Di;
  const T* __restrict A = in.A + i * N;
  T* __restrict carry = m;  // carry_t = a_t . lambda_t, flowing into row t-1; m: the final carry
  ADJSH_LANES
  for (int64_t n = 0; n < N; ++n) carry[n] = 0;
  for (int64_t t = len - 1; t >= 0; --t) {
    const T dt = in.dt[t * Di + i], yb = ybar[t * Di + i];
    const T* __restrict C = in.C + t * in.bc_stride;
    ADJSH_LANES
    for (int64_t n = 0; n < N; ++n) carry[n] = Exp<T>(dt * A[n]) * MulAdd(yb, C[n], carry[n]);
  }
}

// Truncated adjoint: lambda_tau = sum_{t = tau}^{tau + Wt - 1} (prod_{tau < j <= t} a_j) g_t with
// g_t = ybar_t[i] C_t. Rows are cut into blocks of Wt starting at the chunk's first row; for
// tau in block b, the window is [tau, end_b] (a reverse scan L restarted at each block end) plus
// [start_{b+1}, tau + Wt - 1] (a forward prefix F of block b+1 weighted by the running product),
// joined by Q_tau = prod_{tau < j <= end_b} a_j:  lambda_tau = L_tau + Q_tau . F_{tau + Wt - 1}.
// Every term is a sum of products of exact factors: no subtraction, so no cancellation in f32.
template <typename T, int kN>
void WindowedLambda(const ScanInputs<T>& in, int64_t i, int64_t len, int64_t window,
                    const T* ybar, const T* a, std::vector<T>& fwd, T* lam) {
  const int64_t N = kN ? kN : in.N, Di = in.Di, M = in.M, Wt = window;
  const int64_t f_cap = std::min(Wt - 1, M);
  fwd.resize((f_cap + 3) * N);
  T* __restrict L = fwd.data() + f_cap * N;
  T* __restrict Q = L + N;
  T* __restrict R = Q + N;
  for (int64_t sb = 0; sb < len; sb += Wt) {
    const int64_t eb = std::min(sb + Wt, M) - 1;
    const int64_t sn = eb + 1;
    const int64_t f_count = sn < M ? std::min(Wt - 1, M - sn) : 0;
    ADJSH_LANES
    for (int64_t n = 0; n < N; ++n) R[n] = 1, L[n] = 0;  // L doubles as F's running sum here
    for (int64_t k = 0; k < f_count; ++k) {
      const int64_t s = sn + k;
      const T yb = ybar[s * Di + i];
      const T* C = in.C + s * in.bc_stride;
      T* F = fwd.data() + k * N;
      ADJSH_LANES
      for (int64_t n = 0; n < N; ++n) {
        R[n] *= a[s * N + n];
        L[n] += R[n] * (yb * C[n]);
        F[n] = L[n];
      }
    }
    for (int64_t tau = eb; tau >= sb; --tau) {
      const T yb = ybar[tau * Di + i];
      const T* C = in.C + tau * in.bc_stride;
      if (tau == eb) {
        ADJSH_LANES
        for (int64_t n = 0; n < N; ++n) L[n] = yb * C[n], Q[n] = 1;
      } else {
        const T* an = a + (tau + 1) * N;
        ADJSH_LANES
        for (int64_t n = 0; n < N; ++n) {
          L[n] = yb * C[n] + an[n] * L[n];
          Q[n] *= an[n];
        }
      }
      if (tau >= len) continue;
      T* l = lam + tau * N;
      const int64_t k = std::min(tau + Wt - 1, M - 1) - sn;
      if (f_count > 0 && k >= 0) {
        const T* F = fwd.data() + k * N;
        ADJSH_LANES
        for (int64_t n = 0; n < N; ++n) l[n] = L[n] + Q[n] * F[n];
      } else {
        ADJSH_LANES
        for (int64_t n = 0; n < N; ++n) l[n] = L[n];
      }
    }
  }
}

template <typename T, int kN>
void BackwardImpl(const ScanInputs<T>& in, int64_t i, const ScanBackwardOptions& opt,
                  const T* h0, const T* mu, const T* ybar, T d_skip, ScanScratch<T>& scratch,
                  const ScanGrads<T>& out) {
  const int64_t N = kN ? kN : in.N, Di = in.Di, len = opt.len;
  const int64_t rows_a = opt.window > 0 ? in.M : len;
  const T* __restrict A = in.A + i * N;
  scratch.a.resize(rows_a * N);
  scratch.h.resize((len + 1) * N);
  scratch.lam.resize(len * N);
  T* __restrict a = scratch.a.data();
  T* __restrict H = scratch.h.data();  // H[t + 1] = h_t, H[0] = h0
  T* __restrict lam = scratch.lam.data();

  // 1. Forward recompute: a_t (N) for every row the adjoint reads, h_t and y_t for own rows.
  for (int64_t t = 0; t < rows_a; ++t) {
    const T dt = in.dt[t * Di + i];
    ADJSH_LANES
    for (int64_t n = 0; n < N; ++n) a[t * N + n] = Exp<T>(dt * A[n]);
  }
  ADJSH_LANES
  for (int64_t n = 0; n < N; ++n) H[n] = h0 ? h0[n] : T(0);
  for (int64_t t = 0; t < len; ++t) {
    const T x = in.xc[t * Di + i], dtx = in.dt[t * Di + i] * x;
    const T* B = in.B + t * in.bc_stride;
    const T* C = in.C + t * in.bc_stride;
    const T* hp = H + t * N;
    T* hn = H + (t + 1) * N;
    ADJSH_LANES
    for (int64_t n = 0; n < N; ++n) hn[n] = MulAdd(a[t * N + n], hp[n], dtx * B[n]);
    T acc = 0;
    ADJSH_LANES
    for (int64_t n = 0; n < N; ++n) acc += hn[n] * C[n];
    out.y[t * Di + i] = MulAdd(d_skip, x, acc);
  }

  // 2. The adjoint lambda_t (N) for own rows.
  if (opt.window == 0) {
    for (int64_t t = len - 1; t >= 0; --t) {
      const T yb = ybar[t * Di + i];
      const T* C = in.C + t * in.bc_stride;
      T* l = lam + t * N;
      if (t == len - 1) {
        ADJSH_LANES
        for (int64_t n = 0; n < N; ++n) l[n] = MulAdd(yb, C[n], mu ? mu[n] : T(0));
      } else {
        const T* an = a + (t + 1) * N;
        const T* ln = l + N;
        ADJSH_LANES
        for (int64_t n = 0; n < N; ++n) l[n] = MulAdd(an[n], ln[n], yb * C[n]);
      }
    }
    if (out.mu_out) {
      T* mo = out.mu_out + i * N;
      ADJSH_LANES
      for (int64_t n = 0; n < N; ++n) mo[n] = a[n] * lam[n];
    }
  } else {
    WindowedLambda<T, kN>(in, i, len, opt.window, ybar, a, scratch.fwd, lam);
  }

  // 3. Per-token VJPs. With s_a = sum_n (lambda . h_{t-1} . a_t . A)[n] (through a_t) and
  // s_b = lambda_t . B_t (through Delta_t B_t x'_t):
  //   dDelta_t = s_a + x'_t s_b,  dx'_t = Delta_t s_b + D ybar_t,  dB_t += lambda_t Delta_t x'_t,
  //   dC_t += ybar_t h_t,  dA += lambda_t . h_{t-1} . a_t Delta_t,  dD += ybar_t x'_t.
  T* __restrict dA = out.dA + i * N;
  T dD = 0;
  for (int64_t t = 0; t < len; ++t) {
    const T dt = in.dt[t * Di + i], x = in.xc[t * Di + i], yb = ybar[t * Di + i];
    const T dtx = dt * x;
    const T* B = in.B + t * in.bc_stride;
    const T* l = lam + t * N;
    const T* hp = H + t * N;
    const T* hn = H + (t + 1) * N;
    const T* at = a + t * N;
    T* __restrict dB = out.dB + t * N;
    T* __restrict dC = out.dC + t * N;
    ADJSH_LANES
    for (int64_t n = 0; n < N; ++n) {
      dC[n] = MulAdd(yb, hn[n], dC[n]);
      const T ga = l[n] * hp[n] * at[n];  // dL/d(Delta_t A[i, n])
      dA[n] = MulAdd(ga, dt, dA[n]);
      dB[n] = MulAdd(l[n], dtx, dB[n]);
    }
    T s_a = 0, s_b = 0;
    ADJSH_LANES
    for (int64_t n = 0; n < N; ++n) {
      s_a += l[n] * hp[n] * at[n] * A[n];
      s_b += l[n] * B[n];
    }
    out.ddt[t * Di + i] = MulAdd(x, s_b, s_a);
    out.dxc[t * Di + i] = MulAdd(dt, s_b, d_skip * yb);
    dD = MulAdd(yb, x, dD);
  }
  out.dD[i] += dD;
}

}  // namespace

template <typename T>
void ScanForwardChannel(const ScanInputs<T>& in, int64_t i, int64_t rows, const T* h0, T d_skip,
                        T* h_end, T* y) {
  if (in.N == 16) return ForwardImpl<T, 16>(in, i, rows, h0, d_skip, h_end, y);
  ForwardImpl<T, 0>(in, i, rows, h0, d_skip, h_end, y);
}

template <typename T>
void ScanAdjointSummaryChannel(const ScanInputs<T>& in, int64_t i, int64_t len, const T* ybar,
                               T* m) {
  if (in.N == 16) return AdjointSummaryImpl<T, 16>(in, i, len, ybar, m);
  AdjointSummaryImpl<T, 0>(in, i, len, ybar, m);
}

template <typename T>
void ScanBackwardChannel(const ScanInputs<T>& in, int64_t i, const ScanBackwardOptions& opt,
                         const T* h0, const T* mu, const T* ybar, T d_skip, ScanScratch<T>& scratch,
                         const ScanGrads<T>& out) {
  if (in.N == 16) return BackwardImpl<T, 16>(in, i, opt, h0, mu, ybar, d_skip, scratch, out);
  BackwardImpl<T, 0>(in, i, opt, h0, mu, ybar, d_skip, scratch, out);
}

#define ADJSH_INSTANTIATE_SCAN(T)                                                              \
  template void ScanForwardChannel<T>(const ScanInputs<T>&, int64_t, int64_t, const T*, T, T*, \
                                      T*);                                                     \
  template void ScanAdjointSummaryChannel<T>(const ScanInputs<T>&, int64_t, int64_t, const T*, \
                                             T*);                                              \
  template void ScanBackwardChannel<T>(const ScanInputs<T>&, int64_t,                          \
                                       const ScanBackwardOptions&, const T*, const T*,         \
                                       const T*, T, ScanScratch<T>&, const ScanGrads<T>&);
ADJSH_INSTANTIATE_SCAN(float)
ADJSH_INSTANTIATE_SCAN(double)
#undef ADJSH_INSTANTIATE_SCAN

}  // namespace adjsh::cpu
