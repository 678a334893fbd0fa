// Context's copies from and to pageable host memory, through its pinned staging
// (kernels/cuda/context.h). A GPU copies asynchronously only between its memory and pinned host
// memory; from a pageable source the runtime stages the bytes itself and the call may wait, and
// into a pageable destination it waits for the copy, so a task whose small outputs went
// straight to a std::vector would wait once per copy. Here an upload's bytes are copied into
// the staging at once (the caller may reuse its source), and a download's land in their
// destination after the next Sync's wait. The staging is one buffer taken in order between two
// syncs: grown (the old buffer kept until the next Sync, since copies may still read it) to
// what a task moves, at most kStagingCap, past which the context waits for the stream and
// starts over (a counted sync: only copies of more than the cap between two syncs, a model's
// upload or a head's gradient, meet it). Host code only, compiled for the GPU (the kernels
// library) and for the emulated device (tests/cuda/emulated_device.h), under the context's
// mutex like every Context call.
#include <algorithm>
#include <cstring>

#include "kernels/cuda/context.h"

namespace adjsh::cuda {

char* Context::Stage(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;  // each piece on its own cache lines
  if (stage_used_ + bytes > kStagingCap) Sync();
  if (stage_used_ + bytes > stage_bytes_) {
    if (stage_ != nullptr) {
      if (stage_used_ > 0) {
        stage_retired_.push_back(stage_);  // copies queued since the last Sync may read it
      } else {
        ADJSH_CUDA_CHECK(cudaFreeHost(stage_));
      }
    }
    const size_t grown = std::min(kStagingCap, std::max(bytes, 2 * stage_bytes_));
    ADJSH_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&stage_), grown,
                                   cudaHostAllocDefault));
    stage_bytes_ = grown, stage_used_ = 0;
  }
  char* p = stage_ + stage_used_;
  stage_used_ += bytes;
  return p;
}

void Context::Upload(void* dst, const void* src, size_t bytes) {
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, kStagingCap);
    char* staged = Stage(n);
    std::memcpy(staged, static_cast<const char*>(src) + done, n);
    CountedCopy(static_cast<char*>(dst) + done, staged, n, cudaMemcpyHostToDevice);
    done += n;
  }
}

void Context::Download(void* dst, const void* src, size_t bytes) {
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, kStagingCap);
    char* staged = Stage(n);
    CountedCopy(staged, static_cast<const char*>(src) + done, n, cudaMemcpyDeviceToHost);
    landings_.push_back({static_cast<char*>(dst) + done, staged, n});
    done += n;
  }
}

void Context::Sync() {
  DeviceTraffic d;
  d.syncs = 1;
  Note(d);
  SyncStream();
  for (const Landing& l : landings_) std::memcpy(l.dst, l.staged, l.bytes);
  landings_.clear();
  for (char* p : stage_retired_) ADJSH_CUDA_CHECK(cudaFreeHost(p));
  stage_retired_.clear();
  stage_used_ = 0;
}

}  // namespace adjsh::cuda
