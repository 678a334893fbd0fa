// The plain form of the Mamba-2 scan, token by token, and the choice of form
// (kernels/cpu/mamba2_scan.h). The backward, per head in reverse: G_t = dy_t C_t^T +
// exp(dt_{t+1} A) G_{t+1} (P, N) is dL/dS_t, from which dC_t = S_t^T dy_t,
// dx_t = D dy_t + dt_t G_t B_t, dB_t = dt_t G_t^T x_t,
// ddt_t = x_t^T G_t B_t + A exp(dt_t A) <G_t, S_{t-1}>.
#include "kernels/cpu/mamba2_scan.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/mamba2_scan_blocks.h"
#include "kernels/cpu/rmsnorm.h"

namespace adjsh {
namespace {

template <typename T>
void PlainForward(const Mamba2ScanRows<T>& r, T* S, T* y) {
  const Mamba2Dims& d = *r.d;
  const int64_t PN = d.P * d.N, rep = d.H / d.G;
  for (int64_t h = 0; h < d.H; ++h) {
    const int64_t g = h / rep;
    const T A = r.A[h];
    T* Sh = S + h * PN;
    for (int64_t i = 0; i < r.L; ++i) {
      const T dt = r.dt[i * d.H + h], decay = std::exp(dt * A);
      const T* x = &r.xbc[i * d.Cc + h * d.P];
      const T* B = &r.xbc[i * d.Cc + d.Di + g * d.N];
      const T* C = &r.xbc[i * d.Cc + d.Di + d.G * d.N + g * d.N];
      for (int64_t p = 0; p < d.P; ++p) {
        const T xv = dt * x[p];
        T* Sp = Sh + p * d.N;
        for (int64_t n = 0; n < d.N; ++n) Sp[n] = decay * Sp[n] + xv * B[n];
        if (y == nullptr) continue;
        y[i * d.Di + h * d.P + p] = cpu::RowDot(Sp, C, d.N) + r.Dskip[h] * x[p];
      }
    }
  }
}

template <typename T>
void PlainBackward(const Mamba2ScanRows<T>& r, const T* S0, const T* dy, T* carry, T* dxbc,
                   T* ddt, T* dA, T* dD) {
  const Mamba2Dims& d = *r.d;
  const int64_t L = r.L, PN = d.P * d.N, rep = d.H / d.G;
  // Per head, the states recomputed from S0: buf[i + 1] = S after row i.
  std::vector<T> buf((L + 1) * PN), G(PN);
  for (int64_t h = 0; h < d.H; ++h) {
    const int64_t g = h / rep;
    const T A = r.A[h], Dh = r.Dskip[h];
    T dAh = 0, dDh = 0;
    T* ch = carry + h * PN;
    std::copy_n(S0 + h * PN, PN, buf.begin());
    for (int64_t i = 0; i < L; ++i) {
      const T dt = r.dt[i * d.H + h], decay = std::exp(dt * A);
      const T* x = &r.xbc[i * d.Cc + h * d.P];
      const T* B = &r.xbc[i * d.Cc + d.Di + g * d.N];
      const T* prev = &buf[i * PN];
      T* next = &buf[(i + 1) * PN];
      for (int64_t p = 0; p < d.P; ++p)
        for (int64_t n = 0; n < d.N; ++n)
          next[p * d.N + n] = decay * prev[p * d.N + n] + dt * x[p] * B[n];
    }
    for (int64_t i = L - 1; i >= 0; --i) {
      const T dt = r.dt[i * d.H + h], decay = std::exp(dt * A);
      const T* x = &r.xbc[i * d.Cc + h * d.P];
      const T* B = &r.xbc[i * d.Cc + d.Di + g * d.N];
      const T* C = &r.xbc[i * d.Cc + d.Di + d.G * d.N + g * d.N];
      const T* dyt = &dy[i * d.Di + h * d.P];
      const T* St = &buf[(i + 1) * PN];
      const T* Sprev = &buf[i * PN];
      T* dx = &dxbc[i * d.Cc + h * d.P];
      T* dB = &dxbc[i * d.Cc + d.Di + g * d.N];
      T* dC = &dxbc[i * d.Cc + d.Di + d.G * d.N + g * d.N];
      // Row by row of the (P, N) state: the element-wise updates vectorise, and the sums over
      // N are RowDot's fixed lane order (kernels/cpu/rmsnorm.h).
      T xGB = 0, GS = 0;
      for (int64_t p = 0; p < d.P; ++p) {
        T* Gp = &G[p * d.N];
        const T* cp = ch + p * d.N;
        const T* Sp = St + p * d.N;
        const T dyp = dyt[p], dtx = dt * x[p];
        for (int64_t n = 0; n < d.N; ++n) {
          Gp[n] = cp[n] + dyp * C[n];
          dC[n] += Sp[n] * dyp;
          dB[n] += dtx * Gp[n];
        }
        const T GB = cpu::RowDot(Gp, B, d.N);
        GS += cpu::RowDot(Gp, Sprev + p * d.N, d.N);
        dx[p] += Dh * dyp + dt * GB;
        xGB += x[p] * GB;
        dDh += dyt[p] * x[p];
      }
      ddt[i * d.H + h] += xGB + A * decay * GS;
      dAh += decay * dt * GS;
      for (int64_t q = 0; q < PN; ++q) ch[q] = decay * G[q];  // dL/dS_{t-1}
    }
    dA[h] += dAh;
    dD[h] += dDh;
  }
}

template <typename T>
void PlainAdjoint(const Mamba2ScanRows<T>& r, const T* dy, T* carry) {
  const Mamba2Dims& d = *r.d;
  const int64_t PN = d.P * d.N, rep = d.H / d.G;
  for (int64_t h = 0; h < d.H; ++h) {  // G_t = carry + dy_t C_t^T, carry = exp(dt_t A) G_t
    const int64_t g = h / rep;
    T* ch = carry + h * PN;
    for (int64_t i = r.L - 1; i >= 0; --i) {
      const T decay = std::exp(r.dt[i * d.H + h] * r.A[h]);
      const T* C = &r.xbc[i * d.Cc + d.Di + d.G * d.N + g * d.N];
      const T* dyt = &dy[i * d.Di + h * d.P];
      for (int64_t p = 0; p < d.P; ++p) {
        T* cp = ch + p * d.N;
        for (int64_t n = 0; n < d.N; ++n) cp[n] = decay * (cp[n] + dyt[p] * C[n]);
      }
    }
  }
}

}  // namespace

template <typename T>
void Mamba2ScanForward(Mamba2ScanForm form, const Mamba2ScanRows<T>& r, T* S, T* y) {
  if (form == Mamba2ScanForm::kBlocks) return mamba2_blocks::Forward(r, S, y);
  PlainForward(r, S, y);
}

template <typename T>
void Mamba2ScanBackward(Mamba2ScanForm form, const Mamba2ScanRows<T>& r, const T* S0,
                        const T* dy, T* carry, T* dxbc, T* ddt, T* dA, T* dD) {
  if (form == Mamba2ScanForm::kBlocks)
    return mamba2_blocks::Backward(r, S0, dy, carry, dxbc, ddt, dA, dD);
  PlainBackward(r, S0, dy, carry, dxbc, ddt, dA, dD);
}

template <typename T>
void Mamba2ScanAdjoint(Mamba2ScanForm form, const Mamba2ScanRows<T>& r, const T* dy,
                       T* carry) {
  if (form == Mamba2ScanForm::kBlocks) return mamba2_blocks::Adjoint(r, dy, carry);
  PlainAdjoint(r, dy, carry);
}

#define ADJSH_INSTANTIATE(T)                                                                   \
  template void Mamba2ScanForward<T>(Mamba2ScanForm, const Mamba2ScanRows<T>&, T*, T*);        \
  template void Mamba2ScanBackward<T>(Mamba2ScanForm, const Mamba2ScanRows<T>&, const T*,      \
                                      const T*, T*, T*, T*, T*, T*);                           \
  template void Mamba2ScanAdjoint<T>(Mamba2ScanForm, const Mamba2ScanRows<T>&, const T*, T*);
ADJSH_INSTANTIATE(float)
ADJSH_INSTANTIATE(double)
#undef ADJSH_INSTANTIATE

}  // namespace adjsh
