// The selective scan of one chunk on the GPU, fused with everything token-local around it
// (equations in kernels/cpu/scan.h and docs/MATH.md). One thread per (channel i, state n,
// segment): the L >= N lanes of a channel (L a power of two <= 32) sit in one warp and reduce
// over n with shuffles in a fixed order; the chunk's rows are cut into segments of 64 rows that
// run in parallel, joined exactly as chunks are joined (docs/MATH.md "Chunks"): a segment maps a
// state h to exp(A sum Delta) h + h_local, and an adjoint c to m + exp(A sum Delta) c.
//   forward:  per segment, h_local and sum Delta; an O(segments) combine per (i, n) gives each
//             segment's initial state and h_end; per segment again, Delta = softplus(dtpre +
//             b_dt), a = exp(Delta A), h = a h + Delta B x', y = h . C + D x', o = y silu(z).
//             h is never stored.
//   backward: per segment, the state summary and the adjoint summary m; the combine gives each
//             segment's initial state and incoming adjoint (mu for the last); per segment, pass
//             1 runs its forward and keeps the state at every 16th row, pass 2 walks its tiles
//             from the last, recomputes a tile's states into registers from its checkpoint and
//             runs the exact adjoint lambda_t = ybar_t C_t + a_{t+1} lambda_{t+1} with every
//             per-token VJP (gate, D skip, softplus, Delta, B, C, A, x'). dB and dC, sums over
//             channels, are reduced per block in shared memory, then over blocks in order; dA,
//             dD and db_dt per segment, then over segments in order.
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

// o (len, Di) written (nullptr: only h_end); h0 (Di, N) (nullptr: zeros); h_end (Di, N);
// scratch: ScanForwardScratch(len, Di, N) floats.
template <typename S>
void ScanForward(cudaStream_t s, const ScanArgs<S>& a, const float* h0, float* h_end, S* o,
                 float* scratch);
int64_t ScanForwardScratch(int64_t len, int64_t Di, int64_t N);

// The chunk's summaries for the span schedule (kernels/cpu/mamba_block.h LocalSummary and
// AdjointSummary): h_local (Di, N, nullptr: not written) = the scan from a zero state;
// dt_total (Di) = sum of Delta over the rows; with d_o (len, Di) = dL/do, m (Di, N) = a_0
// lambda_0 of the reverse scan from a zero adjoint with ybar = d_o silu(z) (d_o nullptr: m
// not written). scratch: ScanSummaryScratch(len, Di, N) floats.
template <typename S>
void ScanSummary(cudaStream_t s, const ScanArgs<S>& a, const float* d_o, float* h_local,
                 float* m, float* dt_total, float* scratch);
int64_t ScanSummaryScratch(int64_t len, int64_t Di, int64_t N);

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
