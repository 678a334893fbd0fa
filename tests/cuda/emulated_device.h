// The CUDA block and head (kernels/cuda/device_block.cu, lm_head.cu with the scan and op
// kernels) compiled for the host, for tests: kernels run block by block on host threads
// (host_emulation.h), device memory is a host range the host cannot touch outside device work
// (emulated_memory.h), and cuBLAS is replaced by a plain GEMM with f32 sums over the same
// row-major operands. Stricter than a plain host run where a GPU would be: fresh device memory
// (allocations, a grown workspace) is NaN bytes; a launch a GPU would refuse aborts
// (host_emulation.h CheckLaunch); host code reading device memory faults; and every copy
// between host and device must have its host side in pinned memory (cudaHostAlloc), since from
// pageable memory a GPU's asynchronous copy is a host wait, and its device side inside a live
// allocation, never mapped host memory (Memcpy below; copies ahead, from mapped rows on a second
// stream, land only when the stream waits for them: Context::CopyAhead). Include once per test
// binary: it defines the host stand-in for kernels/cuda/context.cu.
#ifndef ADJSH_TESTS_CUDA_EMULATED_DEVICE_H_
#define ADJSH_TESTS_CUDA_EMULATED_DEVICE_H_

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "tests/cuda/host_emulation.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/gemm_mapping.h"

namespace adjsh::emulation {
// The byte every Context::Workspace call fills the workspace with; -1: left as it was.
inline int workspace_poison = -1;
// Pinned host memory is plain host memory here; the live allocations and their bytes are
// counted, so that a test can see staging buffers kept, grown and freed. Mapped ones
// (cudaHostAllocMapped: rows past the device budget, kernels/cuda/device_rows.h) are the
// device's too: kernels reach them, as a GPU's do over PCIe; copies may not (Memcpy below).
inline int64_t pinned_live = 0, pinned_live_bytes = 0, pinned_allocs = 0;
inline int64_t mapped_live_bytes = 0, mapped_peak_bytes = 0;  // the mapped ones
struct PinnedBlock {
  void* p;
  size_t bytes;
  bool mapped;
};
inline std::vector<PinnedBlock> pinned_blocks;
inline std::mutex pinned_mu;
inline cudaError_t HostAlloc(void** p, size_t n, unsigned int flags) {
  *p = std::malloc(n == 0 ? 1 : n);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(pinned_mu);
  const bool mapped = (flags & cudaHostAllocMapped) != 0;
  // Device memory too: as fresh as Alloc's (FreshByte: zeros where kernels are skipped).
  if (mapped) std::memset(*p, skip_kernels ? 0 : 0xff, n);
  pinned_blocks.push_back({*p, n, mapped});
  ++pinned_live, ++pinned_allocs;
  pinned_live_bytes += static_cast<int64_t>(n);
  if (mapped) {
    mapped_live_bytes += static_cast<int64_t>(n);
    mapped_peak_bytes = std::max(mapped_peak_bytes, mapped_live_bytes);
  }
  return cudaSuccess;
}
inline cudaError_t FreeHost(void* p) {
  std::lock_guard<std::mutex> lock(pinned_mu);
  for (size_t k = 0; k < pinned_blocks.size(); ++k) {
    if (pinned_blocks[k].p != p) continue;
    pinned_live_bytes -= static_cast<int64_t>(pinned_blocks[k].bytes);
    if (pinned_blocks[k].mapped)
      mapped_live_bytes -= static_cast<int64_t>(pinned_blocks[k].bytes);
    pinned_blocks.erase(pinned_blocks.begin() + static_cast<std::ptrdiff_t>(k));
    --pinned_live;
    std::free(p);
    return cudaSuccess;
  }
  return cudaErrorInvalidValue;  // not from HostAlloc: a bug the test should see
}
// Whether [p, p + n) lies in one pinned allocation (mapped only: one the device reaches).
inline bool IsPinned(const void* p, size_t n, bool mapped_only = false) {
  std::lock_guard<std::mutex> lock(pinned_mu);
  const char* c = static_cast<const char*>(p);
  for (const PinnedBlock& b : pinned_blocks) {
    const char* at = static_cast<const char*>(b.p);
    if (c >= at && c + n <= at + b.bytes && (b.mapped || !mapped_only)) return true;
  }
  return false;
}
inline bool IsMapped(const void* p, size_t n) { return IsPinned(p, n, /*mapped_only=*/true); }
// The device memory the emulated GPU has (cudaMemGetInfo's total; its free is this less what
// the arena holds); a test may shrink it.
inline size_t device_total_bytes = size_t{80} << 30;
inline cudaError_t MemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  const size_t held = DeviceArena::Get().live_bytes();
  *total_bytes = device_total_bytes;
  *free_bytes = held < device_total_bytes ? device_total_bytes - held : 0;
  return cudaSuccess;
}
// What fresh device memory holds: NaN bytes, as a GPU's holds whatever was there; zeros when the
// kernels are skipped (a counting run), so that what the host code computes from the device's
// results stays finite and a coordinator takes them.
inline int FreshByte() { return skip_kernels ? 0 : 0xff; }
// A copy the GPU would not do as the code means it: named, then abort.
inline void RefuseCopy(const char* what, const void* dst, const void* src, size_t n) {
  std::fprintf(stderr, "emulated device: refused copy of %zu bytes from %p to %p: %s\n", n, src,
               dst, what);
  std::abort();
}
// Every copy: device sides inside live allocations; host sides pinned (a pageable one would
// make the GPU's asynchronous copy a host wait); neither side mapped memory, which only kernels
// may reach (with pinned memory on the other side, a GPU's copy would be host-to-host, outside
// the stream's order: kernels/cuda/ops.h CopyFloats).
inline cudaError_t Memcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return cudaSuccess;
  if (IsMapped(dst, 1) || IsMapped(src, 1))
    RefuseCopy("a side is mapped host memory, which only kernels reach", dst, src, n);
  const bool on_device = kind == cudaMemcpyDeviceToDevice;
  const bool dst_device = on_device || kind == cudaMemcpyHostToDevice;
  const bool src_device = on_device || kind == cudaMemcpyDeviceToHost;
  if (dst_device && !DeviceArena::Get().Contains(dst, n))
    RefuseCopy("its device destination is not inside one device allocation", dst, src, n);
  if (src_device && !DeviceArena::Get().Contains(src, n))
    RefuseCopy("its device source is not inside one device allocation", dst, src, n);
  if (!dst_device && !IsPinned(dst, n))
    RefuseCopy("its host destination is pageable (on a GPU: a host wait)", dst, src, n);
  if (!src_device && !IsPinned(src, n))
    RefuseCopy("its host source is pageable (on a GPU: a host wait)", dst, src, n);
  DeviceAccess access;
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t Memset(void* dst, int v, size_t n) {
  if (n == 0) return cudaSuccess;
  if (!DeviceArena::Get().Contains(dst, n))
    RefuseCopy("a memset outside one device allocation", dst, nullptr, n);
  DeviceAccess access;
  std::memset(dst, v, n);
  return cudaSuccess;
}
}  // namespace adjsh::emulation
#define cudaSetDevice(d) ((void)(d), cudaSuccess)
#define cudaMemcpyAsync(dst, src, n, kind, s) ::adjsh::emulation::Memcpy(dst, src, n, kind)
#define cudaMemsetAsync(dst, v, n, s) ::adjsh::emulation::Memset(dst, v, n)
#define cudaHostAlloc(p, n, flags) ::adjsh::emulation::HostAlloc(p, n, flags)
#define cudaMallocHost(p, n) ::adjsh::emulation::HostAlloc(p, n, 0)
#define cudaFreeHost(p) ::adjsh::emulation::FreeHost(p)
#define cudaHostGetDevicePointer(d, p, flags) ((void)(flags), *(d) = (p), cudaSuccess)
#define cudaMemGetInfo(f, t) ::adjsh::emulation::MemGetInfo(f, t)

// The device code, compiled here for the host; the head in blocks of 8 rows x 16 entries unless
// the includer chose (shapes_emulation_test: the GPU's 1024 x 8192).
#ifndef ADJSH_CUDA_HEAD_ROWS
#define ADJSH_CUDA_HEAD_ROWS 8
#define ADJSH_CUDA_HEAD_VOCAB 16
#endif
#include "kernels/cuda/device_block.cu"
#include "kernels/cuda/lm_head.cu"
#include "kernels/cuda/device_rows.cu"
#include "kernels/cuda/staging.cu"
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
    emulation::DeviceArena& arena = emulation::DeviceArena::Get();
    if (ws_) arena.Free(ws_);
    ws_ = static_cast<char*>(arena.Alloc(bytes, emulation::FreshByte()));
    NoteAllocation();
    Count(static_cast<int64_t>(bytes) - static_cast<int64_t>(ws_bytes_));
    ws_bytes_ = bytes;
  }
  // Whatever an earlier call left in the workspace, as a test chooses: a kernel that reads a
  // workspace byte its call did not write sees this pattern.
  if (emulation::workspace_poison >= 0) {
    emulation::DeviceAccess access;
    std::memset(ws_, emulation::workspace_poison, ws_bytes_);
  }
  return ws_;
}
// Fresh device memory is NaN bytes (0xff), as a GPU's is whatever was there: a kernel or a copy
// that reads what nothing wrote shows it.
void* Context::Alloc(size_t bytes) {
  NoteAllocation();
  Count(static_cast<int64_t>(bytes));
  return emulation::DeviceArena::Get().Alloc(bytes, emulation::FreshByte());
}
void Context::Free(void* p, size_t bytes) {
  Count(-static_cast<int64_t>(bytes));
  emulation::DeviceArena::Get().Free(p);
}
// The device API under Context's counted copies and Sync (kernels/cuda/context.h).
void Context::CopyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  emulation::Memcpy(dst, src, bytes, kind);
}
// Copies ahead: the source is read when the copy is queued (as a GPU's copy may run at once)
// and lands in its destination only when the stream waits for it (AwaitCopy, or a Sync): a
// kernel that reads the destination without the wait sees what was there before. A source
// changed between the two (a GPU's copy could have read either) aborts, named.
namespace {
struct AheadCopy {
  uint64_t ticket;
  void* dst;
  const void* src;
  std::vector<char> bytes;
};
std::vector<AheadCopy> ahead_copies;
void Land(const AheadCopy& c, bool check = true) {
  if (check && std::memcmp(c.src, c.bytes.data(), c.bytes.size()) != 0) {
    std::fprintf(stderr,
                 "emulated device: the source of copy ahead %llu (%zu bytes from %p) changed "
                 "while the copy was in flight\n",
                 static_cast<unsigned long long>(c.ticket), c.bytes.size(), c.src);
    std::abort();
  }
  emulation::DeviceAccess access;
  std::memcpy(c.dst, c.bytes.data(), c.bytes.size());
}
}  // namespace
void Context::SyncStream() {
  for (const AheadCopy& c : ahead_copies) Land(c);
  ahead_copies.clear();
}
void Context::StartAhead(void* dst, const void* src, size_t bytes, uint64_t ticket) {
  if (bytes && !emulation::IsMapped(src, bytes))
    emulation::RefuseCopy("a copy ahead's source is not mapped host memory", dst, src, bytes);
  if (bytes && !emulation::DeviceArena::Get().Contains(dst, bytes))
    emulation::RefuseCopy("a copy ahead's destination is not inside one device allocation", dst,
                          src, bytes);
  const char* from = static_cast<const char*>(src);
  ahead_copies.push_back({ticket, dst, src, std::vector<char>(from, from + bytes)});
}
// A dropped copy lands too, as a GPU's does, read or not; only an awaited one is checked.
void Context::EndAhead(uint64_t ticket, bool await) {
  for (size_t i = 0; i < ahead_copies.size(); ++i) {
    if (ahead_copies[i].ticket != ticket) continue;
    Land(ahead_copies[i], /*check=*/await);
    ahead_copies.erase(ahead_copies.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
}
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
  emulation::DeviceAccess access;
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
