// The selective scan of one Mamba layer over one chunk, forward and adjoint (docs/MATH.md
// "Forward", "The adjoint of the scan"),
// one channel i of the Di inner channels at a time: the N state lanes of a channel are
// independent of every other channel, so a task walks channel by channel with O(M N) scratch
// instead of holding (M, Di, N) states.
//
//   a_t = exp(Delta_t[i] A[i, :])                        (N)
//   h_t = a_t . h_{t-1} + Delta_t[i] B_t x'_t[i]         (N), h_{-1} = h0
//   y_t[i] = h_t . C_t + D[i] x'_t[i]
//   lambda_t = ybar_t[i] C_t + a_{t+1} . lambda_{t+1}    exact adjoint, lambda_len = mu / a
// Letters: M rows (tokens) in the chunk view, len the chunk's own tokens (M - len are lookahead
// rows used by the truncated adjoint only), Di inner width, N state size.
#ifndef ADJSH_KERNELS_CPU_SCAN_H_
#define ADJSH_KERNELS_CPU_SCAN_H_

#include <cstdint>
#include <vector>

namespace adjsh::cpu {

template <typename T>
struct ScanInputs {
  int64_t M = 0, Di = 0, N = 0;
  const T* dt = nullptr;      // (M, Di) Delta
  const T* xc = nullptr;      // (M, Di) x' = silu(conv)
  const T* B = nullptr;       // B_t[n] = B[t * bc_stride + n]
  const T* C = nullptr;       // C_t[n] = C[t * bc_stride + n]
  int64_t bc_stride = 0;      // row stride of B and C (they are columns of the x_proj output)
  const T* A = nullptr;       // (Di, N) A = -exp(A_log)
};

// Per-thread scratch, reused across channels and chunks.
template <typename T>
struct ScanScratch {
  std::vector<T> a, h, lam, fwd;
};

// Forward over rows [0, rows) of channel i from h0 (N, nullptr = zeros). Writes h_end (N) and,
// if y is non-null, y[t * Di + i] for each row.
template <typename T>
void ScanForwardChannel(const ScanInputs<T>& in, int64_t i, int64_t rows, const T* h0, T d_skip,
                        T* h_end, T* y);

// The chunk's adjoint summary for the two-pass scheme: the local reverse scan from zero over
// rows [0, len) with ybar (M, Di), returning m = a_0 . lambda_local_0 (N).
template <typename T>
void ScanAdjointSummaryChannel(const ScanInputs<T>& in, int64_t i, int64_t len, const T* ybar,
                               T* m);

struct ScanBackwardOptions {
  int64_t len = 0;     // the chunk's own rows; rows [len, M) are lookahead
  int64_t window = 0;  // 0: exact adjoint (mu carries the later chunks); else truncated window Wt
};

// Per-channel outputs of the backward scan, written for rows [0, len).
template <typename T>
struct ScanGrads {
  T* y = nullptr;     // (len, Di) y_t[i], written (the block needs it for the gate and out_proj)
  T* ddt = nullptr;   // (len, Di) dL/dDelta_t[i], written
  T* dxc = nullptr;   // (len, Di) dL/dx'_t[i] through the scan and the D skip, written
  T* dB = nullptr;    // (len, N) accumulated over channels
  T* dC = nullptr;    // (len, N) accumulated over channels
  T* dA = nullptr;    // (Di, N) accumulated over chunks: dL/dA[i, :]
  T* dD = nullptr;    // (Di) accumulated: dL/dD[i]
  T* mu_out = nullptr;  // (Di, N) a_0 . lambda_0: the adjoint flowing into the previous
                        // chunk's last row (exact mode), written if non-null
};

// Recomputes the forward of channel i from h0, computes lambda (exact from mu, nullptr = zeros;
// or truncated to the window, with lookahead rows up to min(len + Wt - 1, M)), then the per-token
// VJPs: dL/da_t = lambda_t . h_{t-1}, dL/d(Delta_t B_t x'_t) = lambda_t, dL/dC_t = ybar_t h_t.
template <typename T>
void ScanBackwardChannel(const ScanInputs<T>& in, int64_t i, const ScanBackwardOptions& opt,
                         const T* h0, const T* mu, const T* ybar, T d_skip, ScanScratch<T>& scratch,
                         const ScanGrads<T>& out);

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_SCAN_H_
