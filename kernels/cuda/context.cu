#include "kernels/cuda/context.h"

#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/device_block.h"
#include "kernels/cuda/gemm_mapping.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

namespace adjsh::cuda {

void CheckCuda(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: CUDA error in %s: %s\n", file, line, expr, cudaGetErrorString(err));
  std::abort();
}

void CheckCublas(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  const CublasApi* api = LoadCublas(nullptr);
  std::fprintf(stderr, "%s:%d: cuBLAS error in %s: %s\n", file, line, expr,
               api != nullptr ? api->status_string(st) : "(cuBLAS not loaded)");
  std::abort();
}

namespace {
constexpr size_t kBlasWorkspace = size_t{32} << 20;  // cuBLAS's recommended size on Hopper
}  // namespace

std::shared_ptr<MemoryCounts> MemoryCountsOf(int device) {
  static std::mutex registry_mu;
  static std::vector<std::shared_ptr<MemoryCounts>> registry;
  std::lock_guard<std::mutex> lock(registry_mu);
  if (registry.size() <= static_cast<size_t>(device)) registry.resize(device + 1);
  if (!registry[device]) registry[device] = std::make_shared<MemoryCounts>();
  return registry[device];
}

DeviceMemoryProbe DeviceMemoryProbeOf(int device) {
  std::shared_ptr<const MemoryCounts> counts = MemoryCountsOf(device);
  return [counts]() -> std::optional<DeviceMemoryUsage> {
    // Add raises the peak just after it changes held: a read in between sees held above the
    // peak, hence the max (peak >= used in every reading).
    const int64_t held = std::max<int64_t>(counts->held(), 0);
    DeviceMemoryUsage usage;
    usage.used_bytes = static_cast<uint64_t>(held);
    usage.peak_bytes = static_cast<uint64_t>(std::max(counts->peak_since_start(), held));
    usage.traffic = counts->traffic();
    return usage;
  };
}

Context& Context::Get(int device) {
  static std::mutex registry_mu;
  static std::vector<std::unique_ptr<Context>> registry;
  std::lock_guard<std::mutex> lock(registry_mu);
  if (registry.size() <= static_cast<size_t>(device)) registry.resize(device + 1);
  if (!registry[device]) registry[device].reset(new Context(device));
  return *registry[device];
}

Context::Context(int device) : device_(device), counts_(MemoryCountsOf(device)) {
  ADJSH_CUDA_CHECK(cudaSetDevice(device));
  ADJSH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const CublasApi& blas = Cublas();
  ADJSH_CUBLAS_CHECK(blas.create(&blas_));
  ADJSH_CUBLAS_CHECK(blas.set_stream(blas_, stream_));
  // No TF32, and with bf16 outputs no reduction in bf16: every GEMM sums in f32, as the host
  // emulation of the cuBLAS calls does (tests/cuda/emulated_device.h), where no test could see
  // a bf16 reduction.
  ADJSH_CUBLAS_CHECK(blas.set_math_mode(
      blas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                       CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  ADJSH_CUDA_CHECK(cudaMalloc(&blas_ws_, kBlasWorkspace));
  ADJSH_CUBLAS_CHECK(blas.set_workspace(blas_, blas_ws_, kBlasWorkspace));
  Count(static_cast<int64_t>(kBlasWorkspace));
}

char* Context::Workspace(size_t bytes) {
  if (bytes <= ws_bytes_) return ws_;
  ADJSH_CUDA_CHECK(cudaSetDevice(device_));
  ADJSH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (ws_) ADJSH_CUDA_CHECK(cudaFree(ws_));
  Count(-static_cast<int64_t>(ws_bytes_));
  const size_t grown = bytes + bytes / 8;  // headroom for slightly larger chunks
  ADJSH_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ws_), grown));
  NoteAllocation();
  ws_bytes_ = grown;
  Count(static_cast<int64_t>(grown));
  return ws_;
}

void* Context::Alloc(size_t bytes) {
  ADJSH_CUDA_CHECK(cudaSetDevice(device_));
  void* p = nullptr;
  ADJSH_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
  NoteAllocation();
  Count(static_cast<int64_t>(bytes));
  return p;
}

void Context::Free(void* p, size_t bytes) {
  ADJSH_CUDA_CHECK(cudaSetDevice(device_));
  ADJSH_CUDA_CHECK(cudaFree(p));
  Count(-static_cast<int64_t>(bytes));
}

void Context::CopyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  ADJSH_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
}

void Context::SyncStream() {
  ADJSH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (!copied_ahead_) return;  // dropped copies included
  ADJSH_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  copied_ahead_ = false;
  for (const auto& [ticket, done] : ahead_) spare_events_.push_back(done);
  ahead_.clear();
}

void Context::StartAhead(void* dst, const void* src, size_t bytes, uint64_t ticket) {
  ADJSH_CUDA_CHECK(cudaSetDevice(device_));
  if (copy_stream_ == nullptr) {
    ADJSH_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    ADJSH_CUDA_CHECK(cudaEventCreateWithFlags(&copy_after_, cudaEventDisableTiming));
  }
  cudaEvent_t done = nullptr;
  if (spare_events_.empty()) {
    ADJSH_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  } else {
    done = spare_events_.back();
    spare_events_.pop_back();
  }
  // A wait takes the event's record at the time of the wait: copy_after_ is recorded again
  // for the next copy without disturbing this one.
  ADJSH_CUDA_CHECK(cudaEventRecord(copy_after_, stream_));
  ADJSH_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, copy_after_, 0));
  if (bytes) {
    ADJSH_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_stream_));
  }
  ADJSH_CUDA_CHECK(cudaEventRecord(done, copy_stream_));
  ahead_.emplace_back(ticket, done);
  copied_ahead_ = true;
}

void Context::EndAhead(uint64_t ticket, bool await) {
  for (size_t i = 0; i < ahead_.size(); ++i) {
    if (ahead_[i].first != ticket) continue;
    if (await) ADJSH_CUDA_CHECK(cudaStreamWaitEvent(stream_, ahead_[i].second, 0));
    // The event is recorded again only after this wait. A dropped copy may still run: a later
    // record of its event follows it on the same stream, and its destination is rewritten only
    // by a later copy on that stream.
    spare_events_.push_back(ahead_[i].second);
    ahead_.erase(ahead_.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
}

DeviceTraffic ThreadTraffic() { return ThreadTrafficCounts(); }

void Gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const void* a, cudaDataType_t a_type, int64_t lda, const void* b, cudaDataType_t b_type,
          int64_t ldb, float beta, void* c, cudaDataType_t c_type, int64_t ldc) {
  const CublasApi& blas = Cublas();
  auto col = [&](cublasOperation_t op_a, cublasOperation_t op_b, int64_t cm, int64_t cn,
                 int64_t ck, const float* al, const void* ca, cudaDataType_t cat, int64_t clda,
                 const void* cb, cudaDataType_t cbt, int64_t cldb, const float* be, void* cc,
                 cudaDataType_t cct, int64_t cldc) {
    ADJSH_CUBLAS_CHECK(blas.gemm_ex_64(ctx.blas(), op_a, op_b, cm, cn, ck, al, ca, cat, clda, cb,
                                       cbt, cldb, be, cc, cct, cldc, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
  };
  RowMajorGemm(col, trans_a, trans_b, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c,
               c_type, ldc);
}

}  // namespace adjsh::cuda
