// The selective scan of one chunk on the GPU, fused with everything token-local around it
// (equations in kernels/cpu/scan.h and docs/MATH.md). One thread per (channel i, state n): the
// L >= N lanes of a channel (L a power of two <= 32) sit in one warp and reduce over n with
// shuffles in a fixed order.
//   forward:  Delta = softplus(dtpre + b_dt), a = exp(Delta A), h = a h + Delta B x',
//             y = h . C + D x', o = y silu(z); h is never stored, only h_end.
//   backward: pass 1 runs the forward from h0 and keeps the state at every kTile-th row (Di N
//             floats per kTile rows); pass 2 walks tiles from the last, recomputes the tile's
//             states into registers from its checkpoint, and runs the exact adjoint
//             lambda_t = ybar_t C_t + a_{t+1} lambda_{t+1} (lambda_len = mu) with every
//             per-token VJP (gate, D skip, softplus, Delta, B, C, A, x'). dB and dC, sums over
//             channels, are reduced per block in shared memory and then over blocks in order.
#ifndef ADJSH_KERNELS_CUDA_SCAN_H_
#define ADJSH_KERNELS_CUDA_SCAN_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace adjsh::cuda {

template <typename S>
struct ScanArgs {
  int64_t len = 0, halo = 0, Di = 0, N = 0, R = 0;
  const S* dtpre = nullptr;     // (len, Di) dt_proj output, before the bias
  const float* dt_b = nullptr;  // (Di)
  const S* xc = nullptr;        // (len, Di) x' = silu(conv)
  const S* dbc = nullptr;       // (len, R + 2N) x_proj output [d | B | C]
  const S* xz = nullptr;        // (halo + len, 2 Di) in_proj output; z = columns [Di, 2 Di)
  const float* A = nullptr;     // (Di, N) -exp(A_log)
  const float* Dskip = nullptr; // (Di)
};

// o (len, Di) written (nullptr: only h_end); h0 (Di, N) (nullptr: zeros); h_end (Di, N).
template <typename S>
void ScanForward(cudaStream_t s, const ScanArgs<S>& a, const float* h0, float* h_end, S* o);

template <typename S>
struct ScanBackwardArgs {
  const float* d_o = nullptr;  // (len, Di) dL/do = g W_out
  const float* h0 = nullptr;   // (Di, N)
  const float* mu = nullptr;   // (Di, N) adjoint from the next chunk; nullptr = zeros
  S* o = nullptr;              // (len, Di) o = y silu(z), written (for dW_out)
  S* dxz = nullptr;            // (halo + len, 2 Di): dL/dz of own rows written
  S* ddt = nullptr;            // (len, Di) dL/d(dtpre), written
  float* dxc = nullptr;        // (len, Di) dL/dx' through the scan and D, written
  S* ddbc = nullptr;           // (len, R + 2N): the B and C columns written
  float* dA_log = nullptr;     // (Di, N) written
  float* dD = nullptr;         // (Di) written
  float* ddt_b = nullptr;      // (Di) written
  float* mu_out = nullptr;     // (Di, N) a_0 lambda_0, written if non-null
  float* scratch = nullptr;    // ScanBackwardScratch(len, Di, N) floats
};

int64_t ScanBackwardScratch(int64_t len, int64_t Di, int64_t N);

template <typename S>
void ScanBackward(cudaStream_t s, const ScanArgs<S>& a, const ScanBackwardArgs<S>& b);

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_SCAN_H_
