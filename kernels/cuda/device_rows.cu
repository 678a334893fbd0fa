#include "kernels/cuda/device_rows.h"

#include "kernels/cuda/context.h"
#include "kernels/cuda/ops.h"

namespace adjsh::cuda {
namespace {

// The device's context, locked and current for one call.
struct Locked {
  explicit Locked(int device) : ctx(Context::Get(device)), lock(ctx.mutex()) {
    ADJSH_CUDA_CHECK(cudaSetDevice(device));
  }
  Context& ctx;
  std::lock_guard<std::mutex> lock;
};

}  // namespace

float* RowsAlloc(int device, size_t n) {
  Locked d(device);
  return static_cast<float*>(d.ctx.Alloc(n * sizeof(float)));
}

void RowsFree(int device, float* p, size_t n) {
  Locked d(device);
  d.ctx.Free(p, n * sizeof(float));
}

void RowsUpload(int device, float* dst, const float* src, size_t n) {
  Locked d(device);
  d.ctx.Upload(dst, src, n * sizeof(float));
}

void RowsDownload(int device, float* dst, const float* src, size_t n) {
  Locked d(device);
  d.ctx.Download(dst, src, n * sizeof(float));
}

void RowsCopy(int device, float* dst, const float* src, size_t n) {
  if (n == 0 || dst == src) return;
  Locked d(device);
  ADJSH_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                   d.ctx.stream()));
}

void RowsAdd(int device, float* dst, const float* src, size_t n) {
  if (n == 0) return;
  Locked d(device);
  Add(d.ctx.stream(), dst, src, static_cast<int64_t>(n), dst);
}

void RowsZero(int device, float* dst, size_t n) {
  if (n == 0) return;
  Locked d(device);
  ADJSH_CUDA_CHECK(cudaMemsetAsync(dst, 0, n * sizeof(float), d.ctx.stream()));
}

void RowsFinish(int device) {
  Locked d(device);
  d.ctx.Sync();
}

}  // namespace adjsh::cuda
