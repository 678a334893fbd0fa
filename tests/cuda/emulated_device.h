// The CUDA block and head (kernels/cuda/device_block.cu, lm_head.cu with the scan and op
// kernels) compiled for the host, for tests: kernels run block by block on host threads
// (host_emulation.h), device memory is host memory, and cuBLAS is replaced by a plain GEMM with
// f32 sums over the same row-major operands. Stricter than a plain host run where a GPU would
// be: fresh device memory (allocations, a grown workspace) is NaN bytes, and a launch a GPU
// would refuse aborts (host_emulation.h CheckLaunch). Include once per test binary: it defines
// the host stand-in for kernels/cuda/context.cu.
#ifndef ADJSH_TESTS_CUDA_EMULATED_DEVICE_H_
#define ADJSH_TESTS_CUDA_EMULATED_DEVICE_H_

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "tests/cuda/host_emulation.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/gemm_mapping.h"

namespace adjsh::emulation {
// The byte every Context::Workspace call fills the workspace with; -1: left as it was.
inline int workspace_poison = -1;
inline cudaError_t Memcpy(void* dst, const void* src, size_t n) {
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t Memset(void* dst, int v, size_t n) {
  std::memset(dst, v, n);
  return cudaSuccess;
}
// Pinned host memory is plain host memory here; the live allocations and their bytes are
// counted, so that a test can see staging buffers kept, grown and freed.
inline int64_t pinned_live = 0, pinned_live_bytes = 0, pinned_allocs = 0;
inline std::vector<std::pair<void*, size_t>> pinned_blocks;
inline cudaError_t HostAlloc(void** p, size_t n, unsigned int) {
  *p = std::malloc(n == 0 ? 1 : n);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  pinned_blocks.emplace_back(*p, n);
  ++pinned_live, ++pinned_allocs;
  pinned_live_bytes += static_cast<int64_t>(n);
  return cudaSuccess;
}
inline cudaError_t FreeHost(void* p) {
  for (size_t k = 0; k < pinned_blocks.size(); ++k) {
    if (pinned_blocks[k].first != p) continue;
    pinned_live_bytes -= static_cast<int64_t>(pinned_blocks[k].second);
    pinned_blocks.erase(pinned_blocks.begin() + static_cast<std::ptrdiff_t>(k));
    --pinned_live;
    std::free(p);
    return cudaSuccess;
  }
  return cudaErrorInvalidValue;  // not from HostAlloc: a bug the test should see
}
}  // namespace adjsh::emulation
#define cudaSetDevice(d) ((void)(d), cudaSuccess)
#define cudaMemcpyAsync(dst, src, n, kind, s) ::adjsh::emulation::Memcpy(dst, src, n)
#define cudaMemsetAsync(dst, v, n, s) ::adjsh::emulation::Memset(dst, v, n)
#define cudaHostAlloc(p, n, flags) ::adjsh::emulation::HostAlloc(p, n, flags)
#define cudaMallocHost(p, n) ::adjsh::emulation::HostAlloc(p, n, 0)
#define cudaFreeHost(p) ::adjsh::emulation::FreeHost(p)

// The device code, compiled here for the host; the head in blocks of 8 rows x 16 entries unless
// the includer chose (shapes_emulation_test: the GPU's 1024 x 8192).
#ifndef ADJSH_CUDA_HEAD_ROWS
#define ADJSH_CUDA_HEAD_ROWS 8
#define ADJSH_CUDA_HEAD_VOCAB 16
#endif
#include "kernels/cuda/device_block.cu"
#include "kernels/cuda/lm_head.cu"
#include "kernels/cuda/device_rows.cu"
#include "kernels/cuda/ops.cu"
#include "kernels/cuda/scan.cu"
#include "common/model.h"
#include "kernels/cpu/lm_head.h"
#include "kernels/cpu/mamba_block.h"
#include "tests/kernels/test_util.h"

// The host stand-in for context.cu.
namespace adjsh::cuda {

void CheckCuda(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s failed\n", file, line, expr);
  std::abort();
}
void CheckCublas(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "%s:%d: %s failed\n", file, line, expr);
  std::abort();
}

Context& Context::Get(int device) {
  static Context ctx(device);
  return ctx;
}
Context::Context(int device) : device_(device), counts_(std::make_shared<MemoryCounts>()) {}
char* Context::Workspace(size_t bytes) {
  if (bytes > ws_bytes_) {
    std::free(ws_);
    ws_ = static_cast<char*>(std::malloc(bytes));
    std::memset(ws_, 0xff, bytes);  // fresh: NaN bytes, as Alloc's
    NoteAllocation();
    Count(static_cast<int64_t>(bytes) - static_cast<int64_t>(ws_bytes_));
    ws_bytes_ = bytes;
  }
  // Whatever an earlier call left in the workspace, as a test chooses: a kernel that reads a
  // workspace byte its call did not write sees this pattern.
  if (emulation::workspace_poison >= 0) std::memset(ws_, emulation::workspace_poison, ws_bytes_);
  return ws_;
}
// Fresh device memory is NaN bytes (0xff), as a GPU's is whatever was there: a kernel or a copy
// that reads what nothing wrote shows it.
void* Context::Alloc(size_t bytes) {
  NoteAllocation();
  Count(static_cast<int64_t>(bytes));
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p != nullptr) std::memset(p, 0xff, bytes);
  return p;
}
void Context::Free(void* p, size_t bytes) {
  Count(-static_cast<int64_t>(bytes));
  std::free(p);
}
// The device API under Context's counted Upload, Download and Sync (kernels/cuda/context.h).
void Context::CopyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  std::memcpy(dst, src, bytes);
}
void Context::SyncStream() {}
DeviceTraffic ThreadTraffic() { return ThreadTrafficCounts(); }
// The memory and traffic reader (context.cu's), over the emulated context's counts.
DeviceMemoryProbe DeviceMemoryProbeOf(int device) {
  return [device]() -> std::optional<DeviceMemoryUsage> {
    Context& ctx = Context::Get(device);
    DeviceMemoryUsage usage;
    usage.used_bytes = static_cast<uint64_t>(std::max<int64_t>(ctx.held_bytes(), 0));
    usage.peak_bytes = static_cast<uint64_t>(std::max<int64_t>(ctx.peak_bytes(), 0));
    usage.traffic = ctx.traffic();
    return usage;
  };
}

float LoadAs(const void* p, cudaDataType_t t, int64_t k) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[k];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[k]);
}
void StoreAs(void* p, cudaDataType_t t, int64_t k, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[k] = v;
  } else {
    static_cast<__nv_bfloat16*>(p)[k] = __float2bfloat16_rn(v);
  }
}

// The column-major GEMM cublasGemmEx computes (f32 sums), reached through the same row-major
// mapping as on the GPU (gemm_mapping.h).
void Gemm(Context&, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const void* a, cudaDataType_t a_type, int64_t lda, const void* b, cudaDataType_t b_type,
          int64_t ldb, float beta, void* c, cudaDataType_t c_type, int64_t ldc) {
  if (emulation::skip_kernels) return;
  auto col = [](cublasOperation_t op_a, cublasOperation_t op_b, int64_t cm, int64_t cn,
                int64_t ck, const float* al, const void* ca, cudaDataType_t cat, int64_t clda,
                const void* cb, cudaDataType_t cbt, int64_t cldb, const float* be, void* cc,
                cudaDataType_t cct, int64_t cldc) {
    // Column-major: X[i, j] at i + j ld; op_x(X)[i, q] = X[q, i] when transposed.
    for (int64_t i = 0; i < cm; ++i)
      for (int64_t j = 0; j < cn; ++j) {
        float acc = 0;
        for (int64_t q = 0; q < ck; ++q) {
          const float x = LoadAs(ca, cat, op_a == CUBLAS_OP_T ? q + i * clda : i + q * clda);
          const float y = LoadAs(cb, cbt, op_b == CUBLAS_OP_T ? j + q * cldb : q + j * cldb);
          acc += x * y;
        }
        const float old = *be == 0 ? 0.0f : LoadAs(cc, cct, i + j * cldc);
        StoreAs(cc, cct, i + j * cldc, *al * acc + *be * old);
      }
  };
  RowMajorGemm(col, trans_a, trans_b, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c,
               c_type, ldc);
}

}  // namespace adjsh::cuda

#endif  // ADJSH_TESTS_CUDA_EMULATED_DEVICE_H_
