// One Mamba-2 layer over one chunk of tokens on the GPU, behind a plain C++ interface (no CUDA
// types, like device_block.h): the math and contracts of kernels/cpu/mamba2_layer.h
// (Mamba2ChunkForward, Mamba2ChunkBackward, Mamba2ChunkAdjoint, Mamba2HaloBackward), f32
// compute and storage. Pointers are host memory (each call uploads its inputs, runs on the
// device's stream and returns when its outputs are on the host), or for a resident block device
// memory (a resident span's rows, states and adjoints: a call only queues its kernels; the
// gradient goes into a device sum). Letters as kernels/cpu/mamba2_layer.h:
// D hidden, Di = H P inner, H heads of P channels, G groups (B and C shared by H / G heads),
// N state, W conv kernel, Cc = Di + 2 G N conv channels, Dp = 2 Di + 2 G N + H in_proj rows.
//
// Unlike the CPU functions, which hand the forward's activations (Mamba2ChunkActs) to the
// backward and the adjoint, the device recomputes them from u and the states before t0 (S0)
// inside Backward and Adjoint: nothing of a chunk's activations outlives a call.
#ifndef ADJSH_KERNELS_CUDA_MAMBA2_BLOCK_H_
#define ADJSH_KERNELS_CUDA_MAMBA2_BLOCK_H_

#include <cstdint>
#include <memory>

#include "kernels/mamba2_tensors.h"

namespace adjsh::cuda {

// The plain shape and tensors (kernels/mamba2_tensors.h), also under this namespace.
using ::adjsh::Mamba2Shape;
using ::adjsh::Mamba2ShapeOf;
using ::adjsh::Mamba2Tensors;
using ::adjsh::Mamba2TensorsOf;

class DeviceMamba2Block {
 public:
  // Copies the layer's weights to GPU `device` (f32). resident: every row, state, adjoint and
  // halo pointer of its calls is device memory, and the gradient is added into a device sum
  // (`sum`: GradSize() floats, the tensors back to back in Mamba2Tensors order) instead of grad.
  DeviceMamba2Block(int device, const Mamba2Shape& shape, const Mamba2Tensors<const float>& w,
                    bool resident = false);
  ~DeviceMamba2Block();
  DeviceMamba2Block(const DeviceMamba2Block&) = delete;
  DeviceMamba2Block& operator=(const DeviceMamba2Block&) = delete;

  // Mamba2ChunkForward: u (hb + L, D) the layer input's rows [t0 - hb, t1), hb = min(W - 1, t0);
  // S (H, P, N) the states before t0, left as those after t1 - 1; out (L, D) the layer's
  // addition to its rows, or nullptr for the states alone; dt_sum (H) or nullptr: each head's
  // dt summed over the chunk's rows in row order (on the host, after the download), added to.
  void Forward(const float* u, int64_t t0, int64_t t1, float* S, float* out,
               float* dt_sum = nullptr);
  // Resident: Forward's states alone, each head's dt over the chunk's rows added, in row order,
  // to sigma (Di = H P: the head's sum repeated over its P channels).
  void FoldForward(const float* u, int64_t t0, int64_t t1, float* S, float* sigma);

  // Mamba2ChunkBackward, the forward recomputed from u (as Forward's) and S0 (H, P, N), the
  // states before t0: dout (L, D); carry (H, P, N) = dL/dS_{t1-1} in, dL/dS_{t0-1} out;
  // halo (W - 1, Cc) the gradient of the conv input rows [t1 - W + 1, t1) in, of rows
  // [t0 - W + 1, t0) out; grad accumulated (grad = grad + this chunk's); du (L, D) written.
  // defer_grad: the sum stays on the device (grad uploaded at the first such call for it, its
  // tensors' addresses naming it) until FinishBackward(grad), the same bits with the layer's
  // gradient moved once each way per task rather than per call.
  void Backward(const float* u, int64_t t0, int64_t t1, const float* S0, const float* dout,
                float* carry, float* halo, const Mamba2Tensors<float>& grad, float* du,
                bool defer_grad = false, float* sum = nullptr);

  // Mamba2ChunkAdjoint, the forward recomputed from u and S0 as Backward's: carry (H, P, N)
  // dL/dS_{t1-1} in, dL/dS_{t0-1} out.
  void Adjoint(const float* u, int64_t t0, int64_t t1, const float* S0, const float* dout,
               float* carry);

  // Mamba2HaloBackward: u (n, D) the input rows [t0 - n, t0), n = min(W - 1, t0); halo
  // (W - 1, Cc) as Backward leaves it; the in_proj and norm gradients accumulated into grad
  // (its other tensors untouched); du (n, D) added to.
  void HaloBackward(const float* u, int64_t t0, const float* halo,
                    const Mamba2Tensors<float>& grad, float* du, bool defer_grad = false,
                    float* sum = nullptr);
  // The deferred sum of grad's calls into grad (nothing when none is open).
  void FinishBackward(const Mamba2Tensors<float>& grad);
  int64_t GradSize() const;  // the values of one layer's gradient

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_MAMBA2_BLOCK_H_
