// Device-side element math and storage conversion for the CUDA kernels. Everything computes in
// f32; S (float or bf16) is only how a buffer is stored.
#ifndef ADJSH_KERNELS_CUDA_DEVICE_MATH_CUH_
#define ADJSH_KERNELS_CUDA_DEVICE_MATH_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace adjsh::cuda {

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

__device__ __forceinline__ float SigmoidF(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float SiluF(float x) { return x * SigmoidF(x); }
// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x).
__device__ __forceinline__ float SiluGradF(float x) {
  const float s = SigmoidF(x);
  return s * (1.0f + x * (1.0f - s));
}
// softplus(x) = log(1 + e^x), x itself above 20 (as PyTorch).
__device__ __forceinline__ float SoftplusF(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// A grid-stride loop over [0, n) with 64-bit indices.
#define ADJSH_GRID_LOOP(k, n)                                                        \
  for (int64_t k = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; k < (n);          \
       k += int64_t{gridDim.x} * blockDim.x)

// Blocks for a grid-stride loop of n items with `threads` per block (capped: the loop covers
// the rest).
inline unsigned GridFor(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > 65535 * 16 ? 65535 * 16 : blocks);
}

// Sum over the threads of a block in a fixed tree order (bitwise reproducible); every thread
// gets the total. `shared` holds blockDim.x floats; blockDim.x is a power of two.
__device__ __forceinline__ float BlockSum(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

__device__ __forceinline__ float BlockMax(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_DEVICE_MATH_CUH_
