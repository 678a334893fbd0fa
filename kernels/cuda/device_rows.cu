#include "kernels/cuda/device_rows.h"

#include "kernels/cuda/context.h"
#include "kernels/cuda/ops.h"

#include <cstdio>
#include <cstdlib>

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

float* RowsAllocMapped(int device, size_t n) {
  Locked d(device);
  void* p = nullptr;
  ADJSH_CUDA_CHECK(cudaHostAlloc(&p, n == 0 ? 1 : n * sizeof(float),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
  void* on_device = nullptr;
  ADJSH_CUDA_CHECK(cudaHostGetDevicePointer(&on_device, p, 0));
  if (on_device != p) {  // unified addressing (every 64-bit CUDA platform) makes them one
    std::fprintf(stderr, "mapped host memory at %p is %p on device %d: no unified addressing\n",
                 p, on_device, device);
    std::abort();
  }
  return static_cast<float*>(p);
}

void RowsFreeMapped(int device, float* p) {
  Locked d(device);
  ADJSH_CUDA_CHECK(cudaFreeHost(p));
}

size_t RowsFreeBytes(int device) {
  Locked d(device);
  size_t free_bytes = 0, total_bytes = 0;
  ADJSH_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
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
  CopyFloats(d.ctx.stream(), src, static_cast<int64_t>(n), dst);
}

void RowsAdd(int device, float* dst, const float* src, size_t n) {
  if (n == 0) return;
  Locked d(device);
  Add(d.ctx.stream(), dst, src, static_cast<int64_t>(n), dst);
}

void RowsZero(int device, float* dst, size_t n) {
  if (n == 0) return;
  Locked d(device);
  ZeroFloats(d.ctx.stream(), static_cast<int64_t>(n), dst);
}

void RowsMarkNonFinite(int device, float* flag, const float* src, size_t n) {
  if (n == 0) return;
  Locked d(device);
  MarkNonFinite(d.ctx.stream(), src, static_cast<int64_t>(n), flag);
}

void RowsWidenIds(int device, float* ids, const float* packed, size_t n) {
  if (n == 0) return;
  Locked d(device);
  WidenIds(d.ctx.stream(), reinterpret_cast<const uint16_t*>(packed), static_cast<int64_t>(n),
           reinterpret_cast<uint32_t*>(ids));
}

void RowsFinish(int device) {
  Locked d(device);
  d.ctx.Sync();
}

uint64_t RowsCopyAhead(int device, float* dst, const float* src, size_t n) {
  Locked d(device);
  return d.ctx.CopyAhead(dst, src, n * sizeof(float));
}

void RowsAwait(int device, uint64_t ticket) {
  Locked d(device);
  d.ctx.AwaitCopy(ticket);
}

void RowsDrop(int device, uint64_t ticket) {
  Locked d(device);
  d.ctx.DropCopy(ticket);
}

}  // namespace adjsh::cuda
