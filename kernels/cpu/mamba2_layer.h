// One Mamba-2 layer over one chunk of tokens [t0, t1), forward and backward
// (docs/MATH.md "Mamba-2"). What crosses chunks is small: each head's SSM state (H, P, N) going
// forward, its adjoint (H, P, N) going backward, and the causal conv's halo: the chunk reads the
// layer input's W - 1 rows before t0 (recomputing their in_proj), and its backward hands their
// gradient to the chunks before. A layer's gradient is thus any chunking's, up to rounding, with
// memory for one chunk's activations.
#ifndef ADJSH_KERNELS_CPU_MAMBA2_LAYER_H_
#define ADJSH_KERNELS_CPU_MAMBA2_LAYER_H_

#include <cstdint>
#include <vector>

#include "common/mamba2_model.h"

namespace adjsh {

struct Mamba2Dims {
  int64_t D, Di, H, P, G, N, W, Cc, Dp;
  explicit Mamba2Dims(const Mamba2Config& c);
};

// A chunk's activations, rows of the chunk (L = t1 - t0) or, for xn, r1 and zx, of the halo rows
// [t0 - hb, t0) (hb = min(W - 1, t0)) and then the chunk's.
template <typename T>
struct Mamba2ChunkActs {
  int64_t t0 = 0, t1 = 0, hb = 0;
  std::vector<T> xn, r1, zx;   // (hb + L, D), (hb + L), (hb + L, Dp): [z | xBC_in | dt_raw]
  std::vector<T> pre, xbc;     // (L, Cc): conv + bias, silu of it = [x | B | C]
  std::vector<T> dt;           // (L, H): softplus, clamped
  std::vector<T> y, gv, n;     // (L, Di): the scan's output, y silu(z), the gated norm's output
  std::vector<T> r2;           // (L, G): the gated norm's 1 / rms per group
  std::vector<T> S0;           // (H, P, N): the states before t0
};

// The chunk's forward: u holds the layer input's rows [t0 - hb, t1), hb = min(W - 1, t0) (the
// conv halo, then the chunk's own rows);
// S (H, P, N) holds the states before t0 and is left holding those after t1 - 1; out (L, D) gets
// the layer's addition to its rows (u^{k+1} = u + out). a keeps what the backward reads. With
// out null only the states are computed (and a is no backward's input).
template <typename T>
void Mamba2ChunkForward(const Mamba2Layer<T>& l, const Mamba2Config& cfg, const T* u,
                        int64_t t0, int64_t t1, T* S, Mamba2ChunkActs<T>& a, T* out);

// The chunk's backward after its forward (a), with the same u: dout (L, D) = dL/du^{k+1} of
// its rows; carry
// (H, P, N) = dL/dS_{t1-1} from the later chunks (zero for the last), left as dL/dS_{t0-1};
// halo (W - 1, Cc) = the gradient of the conv input rows [t1 - W + 1, t1) from the later
// chunks, left as that of rows [t0 - W + 1, t0). Accumulates the layer's gradient into g and
// writes du (L, D) = dL/du^k of the chunk's rows (the residual's dout and the mixer's part).
template <typename T>
void Mamba2ChunkBackward(const Mamba2Layer<T>& l, const Mamba2Config& cfg, const T* u,
                         const Mamba2ChunkActs<T>& a, const T* dout, T* carry, T* halo,
                         Mamba2Layer<T>& g, T* du);

// The span schedule's adjoint summary (engine/mamba2_grad.cc): the chunk's dy from dout and
// its forward (a), then only the heads' adjoint recursion: carry (H, P, N) = dL/dS_{t1-1}
// from the later tokens is left as dL/dS_{t0-1}, with nothing else computed. Affine in the
// incoming carry, with the chunk's decay product as its slope.
template <typename T>
void Mamba2ChunkAdjoint(const Mamba2Layer<T>& l, const Mamba2Config& cfg,
                        const Mamba2ChunkActs<T>& a, const T* dout, T* carry);

// The gradient a later span's conv hands back to the input rows [t0 - n, t0) before it
// (n = min(W - 1, t0); halo (W - 1, Cc) as Mamba2ChunkBackward leaves it, rows [t0 - W + 1, t0)):
// through in_proj and the pre-norm, recomputed from u (those n rows, (n, D)), into gl, and
// added to du (n, D). What Mamba2ChunkBackward does with an incoming halo, for the rows of
// another span, after it ran.
template <typename T>
void Mamba2HaloBackward(const Mamba2Layer<T>& l, const Mamba2Config& cfg, const T* u,
                        int64_t t0, const T* halo, Mamba2Layer<T>& gl, T* du);

}  // namespace adjsh

#endif  // ADJSH_KERNELS_CPU_MAMBA2_LAYER_H_
