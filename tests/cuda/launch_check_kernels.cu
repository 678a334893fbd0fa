// Kernels launched through ADJSH_LAUNCH for launch_check_test.cc: one that computes, one that
// faults on the device (a write through a null pointer), and a launch a GPU refuses.
#include "kernels/cuda/launch.cuh"

namespace adjsh::cuda::testing {
namespace {

__global__ void FillKernel(int* out, int n, int v) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = v;
}

__global__ void WriteThroughNullKernel(int* out) { out[threadIdx.x] = 1; }

}  // namespace

// Fills n ints with v on the device and returns whether every one came back as v.
bool FillOnDevice(int n, int v) {
  int* d = nullptr;
  if (cudaMalloc(&d, n * sizeof(int)) != cudaSuccess) return false;
  ADJSH_LAUNCH(FillKernel, dim3((n + 127) / 128), dim3(128), cudaStream_t{}, d, n, v);
  int* h = new int[n];
  const bool copied = cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
  bool ok = copied;
  for (int i = 0; ok && i < n; ++i) ok = h[i] == v;
  delete[] h;
  cudaFree(d);
  return ok;
}

// Launches fine; faults on the device when it runs.
void WriteThroughNull() {
  ADJSH_LAUNCH(WriteThroughNullKernel, dim3(1), dim3(32), cudaStream_t{}, nullptr);
}

// 2048 threads per block: refused at the launch by every GPU (and by a machine without one).
void LaunchTooManyThreads() {
  int* d = nullptr;
  ADJSH_LAUNCH(FillKernel, dim3(1), dim3(2048), cudaStream_t{}, d, 0, 0);
}

}  // namespace adjsh::cuda::testing
