// Per-device CUDA state shared by every block and head of the process: one stream, one cuBLAS
// handle with a fixed workspace (cuBLAS is bitwise reproducible run to run on one stream with a
// fixed workspace), a growable scratch workspace carved per call, and byte counts for the memory
// report. Calls on a device are serialised by its mutex: a call uploads its inputs, runs its
// kernels on the stream and downloads its outputs, so the workspace is free again when it ends;
// a resident call (device_block.h) returns with its kernels queued, and the next call's use of
// the workspace follows them on the one stream.
// The byte counts alone are read from any thread without the mutex (MemoryCounts).
//
// Host memory on the far side of a copy is staged through pinned memory the context keeps
// (staging.cu), so that copies are asynchronous on a GPU and a task waits for its device once.
// Every copy between host and device, every stream sync and every device allocation goes
// through a Context, which counts it (common/device_memory.h DeviceTraffic) per device and per
// calling thread before the device API does it; the host-emulated device
// (tests/cuda/emulated_device.h) defines only the device API calls, so what it counts is what a
// GPU's run counts.
#ifndef ADJSH_KERNELS_CUDA_CONTEXT_H_
#define ADJSH_KERNELS_CUDA_CONTEXT_H_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "common/device_memory.h"

// Errors of the CUDA runtime or cuBLAS after the device was validated are device faults or
// programming errors: report where and abort (a silently wrong gradient is worse than a crash).
#define ADJSH_CUDA_CHECK(expr) ::adjsh::cuda::CheckCuda((expr), #expr, __FILE__, __LINE__)
#define ADJSH_CUBLAS_CHECK(expr) ::adjsh::cuda::CheckCublas((expr), #expr, __FILE__, __LINE__)

namespace adjsh::cuda {

void CheckCuda(cudaError_t err, const char* expr, const char* file, int line);
void CheckCublas(cublasStatus_t st, const char* expr, const char* file, int line);

using bf16 = __nv_bfloat16;

template <typename S>
constexpr cudaDataType_t DataType();
template <>
constexpr cudaDataType_t DataType<float>() { return CUDA_R_32F; }
template <>
constexpr cudaDataType_t DataType<bf16>() { return CUDA_R_16BF; }

// The bytes adjsh holds on one GPU (parameters + workspace + cuBLAS workspace). Changed by its
// context (under the context's mutex), read from any thread at any time: the metrics server's
// scrapes read it while a call runs (DeviceMemoryProbeOf, device_block.h). Each peak is raised
// by a compare-and-swap loop, so it is at least every value `held` took, however the changes
// and the reads interleave.
class MemoryCounts {
 public:
  void Add(int64_t delta) {
    const int64_t now = held_.fetch_add(delta) + delta;
    RaiseTo(peak_, now);
    RaiseTo(peak_since_start_, now);
  }
  int64_t held() const { return held_.load(); }
  // The most held since the last ResetPeak (benchmarks measure one run with it).
  int64_t peak() const { return peak_.load(); }
  // The most held since the process started: ResetPeak leaves it.
  int64_t peak_since_start() const { return peak_since_start_.load(); }
  void ResetPeak() { peak_.store(held_.load()); }

 private:
  static void RaiseTo(std::atomic<int64_t>& peak, int64_t value) {
    int64_t seen = peak.load();
    while (seen < value && !peak.compare_exchange_weak(seen, value)) {
    }
  }

  std::atomic<int64_t> held_{0}, peak_{0}, peak_since_start_{0};

 public:
  // The device's traffic since the process started (DeviceTraffic), added to by its Context.
  void AddTraffic(const DeviceTraffic& d) {
    h2d_bytes_ += d.h2d_bytes, d2h_bytes_ += d.d2h_bytes;
    h2d_copies_ += d.h2d_copies, d2h_copies_ += d.d2h_copies;
    syncs_ += d.syncs, allocations_ += d.allocations;
  }
  DeviceTraffic traffic() const {
    DeviceTraffic t;
    t.h2d_bytes = h2d_bytes_.load(), t.d2h_bytes = d2h_bytes_.load();
    t.h2d_copies = h2d_copies_.load(), t.d2h_copies = d2h_copies_.load();
    t.syncs = syncs_.load(), t.allocations = allocations_.load();
    return t;
  }

 private:
  std::atomic<uint64_t> h2d_bytes_{0}, d2h_bytes_{0}, h2d_copies_{0}, d2h_copies_{0}, syncs_{0},
      allocations_{0};
};

// The traffic the calling thread has caused on every device since it started: a task's own is
// the difference of two readings on the thread that ran it (kernels/backend.h
// Backend::ThreadTraffic).
inline DeviceTraffic& ThreadTrafficCounts() {
  thread_local DeviceTraffic t;
  return t;
}

// The counts of GPU `device`, created on first use (no CUDA call: reading them never creates the
// device's context) and shared by its context and every reader for the process's life.
std::shared_ptr<MemoryCounts> MemoryCountsOf(int device);

class Context {
 public:
  // The context of GPU `device` (created on first use, kept for the process's life).
  static Context& Get(int device);

  std::mutex& mutex() { return mu_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  int device() const { return device_; }

  // At least `bytes` of scratch, valid until the next call queues its work (growth synchronises
  // the stream).
  char* Workspace(size_t bytes);

  // Device memory outside the workspace (layer parameters), counted in the report.
  void* Alloc(size_t bytes);
  void Free(void* p, size_t bytes);

  // Copies between the device and host memory that may be pageable (a std::vector's), queued on
  // the stream and counted (DeviceTraffic): the host side goes through the context's pinned
  // staging (kernels/cuda/staging.cu), since from pageable memory a GPU's asynchronous copy is a
  // host wait. Upload has read `src` when it returns; Download's bytes reach `dst` at the next
  // Sync. Staging grows to what the calls between two syncs move, up to kStagingCap; past that
  // the context waits for the stream (a counted sync) and starts the staging over.
  void Upload(void* dst, const void* src, size_t bytes);
  void Download(void* dst, const void* src, size_t bytes);
  // The same where the host side is already pinned (cudaHostAlloc) and stays until the next
  // Sync (device_block.cu's own staging): queued as it is.
  void UploadPinned(void* dst, const void* src, size_t bytes) {
    CountedCopy(dst, src, bytes, cudaMemcpyHostToDevice);
  }
  void DownloadPinned(void* dst, const void* src, size_t bytes) {
    CountedCopy(dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  // The host waits for the stream (and the copies ahead); staged downloads land, and the
  // staging is free again.
  void Sync();

  // Copies ahead, on the context's second stream, so that they overlap the kernels queued on the
  // stream: rows past the device budget (mapped pinned host memory, src) into device memory
  // (dst), the next chunk's while this one's kernels run (kernels/cuda/device_row_space.h
  // DeviceRowSpace::ReadRows). A copy starts after everything queued on the stream so far (an
  // event), so it sees every write queued before it and overwrites nothing a queued kernel still
  // reads. It returns a ticket: AwaitCopy makes the stream's later work wait for the copy (an
  // event; no host wait), DropCopy forgets one nothing will read; a Sync covers every copy
  // (either is then a no-op). Counted as an upload.
  uint64_t CopyAhead(void* dst, const void* src, size_t bytes) {
    NoteCopy(bytes, /*up=*/true);
    StartAhead(dst, src, bytes, next_ticket_);
    return next_ticket_++;
  }
  void AwaitCopy(uint64_t ticket) { EndAhead(ticket, /*await=*/true); }
  void DropCopy(uint64_t ticket) { EndAhead(ticket, /*await=*/false); }
  static constexpr size_t kStagingCap = size_t{64} << 20;
  size_t staging_bytes() const { return stage_bytes_; }  // pinned host memory it keeps

  // Bytes held now (parameters + workspace + cuBLAS workspace) and the most held since the last
  // ResetPeak; thread-safe (MemoryCounts).
  int64_t held_bytes() const { return counts_->held(); }
  int64_t peak_bytes() const { return counts_->peak(); }
  void ResetPeak() { counts_->ResetPeak(); }
  DeviceTraffic traffic() const { return counts_->traffic(); }  // since the process started

 private:
  explicit Context(int device);
  void Count(int64_t delta) { counts_->Add(delta); }
  void Note(const DeviceTraffic& d) {
    counts_->AddTraffic(d);
    ThreadTrafficCounts() += d;
  }
  void NoteAllocation() {
    DeviceTraffic d;
    d.allocations = 1;
    Note(d);
  }
  // One host-device copy of `bytes` counted, up or down (nothing for 0 bytes).
  void NoteCopy(size_t bytes, bool up) {
    if (bytes == 0) return;
    DeviceTraffic d;
    (up ? d.h2d_bytes : d.d2h_bytes) = bytes;
    (up ? d.h2d_copies : d.d2h_copies) = 1;
    Note(d);
  }
  // A host-device copy of `kind`, counted each way.
  void CountedCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return;
    NoteCopy(bytes, kind == cudaMemcpyHostToDevice);
    CopyAsync(dst, src, bytes, kind);
  }
  // The device API under Upload, Download, Sync and the copies ahead (context.cu; the emulated
  // device's own). EndAhead: the stream waits for the copy (await) or it is forgotten; a ticket
  // a Sync covered is a no-op.
  void CopyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
  void SyncStream();  // and the copies ahead, which it then forgets
  void StartAhead(void* dst, const void* src, size_t bytes, uint64_t ticket);
  void EndAhead(uint64_t ticket, bool await);
  // `bytes` (at most kStagingCap) of pinned staging until the next Sync (staging.cu).
  char* Stage(size_t bytes);

  int device_;
  std::mutex mu_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* blas_ws_ = nullptr;
  char* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  // Pinned staging (staging.cu): the buffer, its size and what the calls since the last Sync
  // took of it; buffers it outgrew, freed at the next Sync; downloads that land then.
  char* stage_ = nullptr;
  size_t stage_bytes_ = 0, stage_used_ = 0;
  std::vector<char*> stage_retired_;
  struct Landing {
    void* dst;
    const char* staged;
    size_t bytes;
  };
  std::vector<Landing> landings_;
  // The copies ahead (context.cu): their stream, made on first use; an event recorded on the
  // stream for each to start after; the event of each in flight by ticket, and spare ones.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copy_after_ = nullptr;
  std::vector<std::pair<uint64_t, cudaEvent_t>> ahead_;
  std::vector<cudaEvent_t> spare_events_;
  uint64_t next_ticket_ = 1;
  bool copied_ahead_ = false;  // since the last Sync
  const std::shared_ptr<MemoryCounts> counts_;  // MemoryCountsOf(device_)
};

// Lays buffers out in one workspace: run a layout once on a sizing carver (base nullptr), take
// Workspace(used()), then run it again on a carver over that base.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename X>
  X* Take(int64_t n) {
    const size_t off = used_;
    used_ += (static_cast<size_t>(n) * sizeof(X) + 255) / 256 * 256;
    return base_ ? reinterpret_cast<X*>(base_ + off) : nullptr;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

template <typename Layout>
void CarveWorkspace(Context& ctx, Layout&& layout) {
  Carver sizing(nullptr);
  layout(sizing);
  Carver real(ctx.Workspace(sizing.used()));
  layout(real);
}

// Row-major C (m, n) = alpha op(A) op(B) + beta C with op(A) (m, k), op(B) (k, n); leading
// dimensions are row strides; f32 accumulation whatever the storage types (no TF32).
void Gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const void* a, cudaDataType_t a_type, int64_t lda, const void* b, cudaDataType_t b_type,
          int64_t ldb, float beta, void* c, cudaDataType_t c_type, int64_t ldc);

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_CONTEXT_H_
