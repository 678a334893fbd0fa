// The resident span rows' space on one GPU (kernels/row_space.h), made by the CUDA backend
// (kernels/cuda/cuda_backend.cc): device memory up to a budget, mapped pinned host memory past it,
// and the copies ahead that bring spilled rows back (ReadRows). Plain C++ over
// kernels/cuda/device_rows.h, so that it needs no CUDA headers; header-only, so that the
// host-emulated builds that compile the backend's source get it too.
#ifndef ADJSH_KERNELS_CUDA_DEVICE_ROW_SPACE_H_
#define ADJSH_KERNELS_CUDA_DEVICE_ROW_SPACE_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cuda/device_rows.h"
#include "kernels/row_space.h"

namespace adjsh::cuda {

// A resident span's memory on the GPU (kernels/cuda/device_rows.h); it keeps up to 512 MiB of
// freed buffers for reuse (a free syncs the device). What grows with the spans (stored rows,
// cotangents, (V, D) partials: RowSpace::Alloc's may_spill) takes device memory up to the budget
// (Device::row_budget; unset: 80% of what is free when the first rows come, after the model's
// parameters, leaving the rest to the workspace, which grows with the chunk, not the context);
// states and a layer's partial sums count against it but always take device memory. Past it, a
// buffer is mapped pinned host memory: the same bits, and no device allocation that fails
// mid-step. Kernels write it in place over PCIe, and a chunk's stored rows come back as a copy
// to device memory on a second stream (ReadRows, whose reader names the chunk it reads next:
// that copy runs while this chunk's kernels do), since a kernel reading host memory waits on
// PCIe at every load, and a GEMM loads its inputs many times. Only kernels and those copies
// touch a mapped buffer on the device's side (ops.h CopyFloats, ZeroFloats: a cudaMemcpyAsync
// between it and pinned staging would be host-to-host, outside the stream's order); its uploads
// and downloads wait for the stream (a counted sync) and copy on the host.
class DeviceRowSpace final : public RowSpace<float> {
 public:
  DeviceRowSpace(int device, int64_t budget)
      : RowSpace<float>(size_t{512} << 20), device_(device), budget_(budget) {
    readers_->space = this;
  }
  ~DeviceRowSpace() override {  // one wait, then the staging's and the pool's buffers go
    {
      std::lock_guard<std::mutex> lock(readers_->mu);
      readers_->space = nullptr;  // reader threads that end later find it gone
    }
    RowsFinish(device_);
    for (auto& [key, s] : staging_) {
      for (Slot& slot : s.slot) {
        if (slot.data) RowsFree(device_, slot.data, slot.cap);
      }
    }
    for (const auto& [p, n] : retired_) RowsFree(device_, p, n);
    Drain();
  }
  bool host() const override { return false; }
  void Upload(float* dst, const float* src, size_t n) override {
    if (!Mapped(dst)) return RowsUpload(device_, dst, src, n);
    RowsFinish(device_);  // no queued kernel reads dst any more
    std::memcpy(dst, src, n * sizeof(float));
  }
  void Download(float* dst, const float* src, size_t n) override {
    if (!Mapped(src)) return RowsDownload(device_, dst, src, n);
    RowsFinish(device_);  // every queued write of src is done
    std::memcpy(dst, src, n * sizeof(float));
  }
  void Copy(float* dst, const float* src, size_t n) override { RowsCopy(device_, dst, src, n); }
  void Add(float* dst, const float* src, size_t n) override { RowsAdd(device_, dst, src, n); }
  void Zero(float* dst, size_t n) override { RowsZero(device_, dst, n); }
  void MarkNonFinite(float* flag, const float* src, size_t n) override {
    RowsMarkNonFinite(device_, flag, src, n);
  }
  void WidenIds(float* ids, const float* packed, size_t n) override {
    RowsWidenIds(device_, ids, packed, n);
  }
  void Finish() override {
    RowsFinish(device_);
    std::vector<std::pair<float*, size_t>> retired;
    {
      std::lock_guard<std::mutex> lock(mu_);
      retired.swap(retired_);
    }
    for (const auto& [p, n] : retired) RowsFree(device_, p, n);
    AfterWait();
  }
  // Two device buffers per key take turns: one holds the rows returned (read by kernels queued
  // after this call), the other the copy of `next` (which starts after those kernels' inputs of
  // the call before: Context::CopyAhead).
  const float* ReadRows(const float* p, size_t n, const void* key, const float* next,
                        size_t next_n) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (n == 0 || !MappedLocked(p)) return p;
    auto [at, fresh] = staging_.try_emplace(key);
    if (fresh) ThreadReaders().keys.emplace_back(readers_, key);
    Staging& s = at->second;
    int cur = -1;
    for (int i = 0; i < 2; ++i) {
      if (s.slot[i].ticket && s.slot[i].src == p && s.slot[i].n == n) cur = i;
    }
    if (cur < 0) {  // not on its way: copy it now
      cur = 1 - s.last;
      Forget(s.slot[cur]);
      Fit(s, cur, n, lock);
      Start(s.slot[cur], p, n);
    }
    RowsAwait(device_, s.slot[cur].ticket);
    s.slot[cur].ticket = 0, s.slot[cur].src = nullptr;
    Slot& other = s.slot[1 - cur];
    Forget(other);
    if (next != nullptr && next_n > 0 && MappedLocked(next)) {
      Fit(s, 1 - cur, next_n, lock);
      Start(other, next, next_n);
    }
    s.last = cur;
    return s.slot[cur].data;
  }

 private:
  // Device memory, counted against the budget, which it may pass: only what may spill goes
  // elsewhere past it.
  float* Allocate(size_t n) override { return Place(n, false); }
  float* AllocateSpillable(size_t n) override { return Place(n, true); }
  bool Spilled(const float* p) const override { return Mapped(p); }
  float* Place(size_t n, bool may_spill) {
    const int64_t bytes = static_cast<int64_t>(n * sizeof(float));
    std::lock_guard<std::mutex> lock(mu_);
    if (budget_ < 0) budget_ = static_cast<int64_t>(RowsFreeBytes(device_) / 5 * 4);
    if (!may_spill || device_bytes_ + bytes <= budget_) {
      device_bytes_ += bytes;
      return RowsAlloc(device_, n);
    }
    float* p = RowsAllocMapped(device_, n);
    mapped_.emplace(p, n);
    return p;
  }
  // The wait and the free outside the lock: other threads' copies ask Mapped meanwhile.
  void Release(float* p, size_t n) override {
    bool mapped = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mapped = mapped_.erase(p) > 0;
      if (!mapped) device_bytes_ -= static_cast<int64_t>(n * sizeof(float));
      for (auto& [key, s] : staging_) {  // a copy on its way from p is nobody's any more
        for (Slot& slot : s.slot) {
          if (slot.ticket && slot.src >= p && slot.src < p + n) Forget(slot);
        }
      }
    }
    if (mapped) {
      RowsFinish(device_);  // as cudaFree does: no queued kernel may still use it
      RowsFreeMapped(device_, p);
    } else {
      RowsFree(device_, p, n);
    }
  }

  const int device_;
  mutable std::mutex mu_;
  int64_t budget_;  // bytes; < 0 until the first rows come (the default)
  int64_t device_bytes_ = 0;  // what the rows hold of the device's memory (pooled included)
  std::map<const float*, size_t> mapped_;  // the buffers past the budget: start -> floats

  // A device buffer of ReadRows's, and the copy ahead on its way into it (ticket 0: none).
  struct Slot {
    float* data = nullptr;
    size_t cap = 0;  // floats
    const float* src = nullptr;
    size_t n = 0;
    uint64_t ticket = 0;
  };
  struct Staging {
    Slot slot[2];
    int last = 1;  // the slot the last call returned
  };
  std::map<const void*, Staging> staging_;  // by ReadRows's key; counted in device_bytes_

  // A step's threads are made anew each step (a ThreadPool per step), so the staging of a
  // reader whose thread ends goes at the space's next Finish: each thread keeps the keys it made
  // and hands them back at its exit, while the space lives (Readers, under its mutex).
  struct Readers {
    std::mutex mu;
    DeviceRowSpace* space = nullptr;  // null once the space is gone
  };
  struct ThreadKeys {
    std::vector<std::pair<std::shared_ptr<Readers>, const void*>> keys;
    ~ThreadKeys() {
      for (const auto& [readers, key] : keys) {
        std::lock_guard<std::mutex> lock(readers->mu);
        if (readers->space) readers->space->Orphan(key);
      }
    }
  };
  static ThreadKeys& ThreadReaders() {
    thread_local ThreadKeys keys;
    return keys;
  }
  const std::shared_ptr<Readers> readers_ = std::make_shared<Readers>();
  void Orphan(const void* key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = staging_.find(key);
    if (it == staging_.end()) return;
    for (Slot& slot : it->second.slot) {
      Forget(slot);
      if (!slot.data) continue;
      retired_.emplace_back(slot.data, slot.cap);
      device_bytes_ -= static_cast<int64_t>(slot.cap * sizeof(float));
    }
    staging_.erase(it);
  }

  void Start(Slot& slot, const float* src, size_t n) {
    slot.ticket = RowsCopyAhead(device_, slot.data, src, n);
    slot.src = src, slot.n = n;
  }
  void Forget(Slot& slot) {
    if (slot.ticket) RowsDrop(device_, slot.ticket);
    slot.ticket = 0, slot.src = nullptr;
  }
  // Slot i of s holds at least n floats. A buffer it outgrows may still be read by queued
  // kernels or written by a dropped copy: it goes at the next Finish.
  void Fit(Staging& s, int i, size_t n, std::unique_lock<std::mutex>& lock) {
    Slot& slot = s.slot[i];
    if (slot.cap >= n) return;
    if (slot.data) retired_.emplace_back(slot.data, slot.cap);
    device_bytes_ += static_cast<int64_t>((n - slot.cap) * sizeof(float));
    slot.data = nullptr, slot.cap = 0;
    lock.unlock();  // an allocation on the device, under the device's lock
    float* grown = RowsAlloc(device_, n);
    lock.lock();
    slot.data = grown, slot.cap = n;
  }
  std::vector<std::pair<float*, size_t>> retired_;  // outgrown slots, freed at the next Finish

  // Whether p lies in a mapped buffer.
  bool Mapped(const float* p) const {
    std::lock_guard<std::mutex> lock(mu_);
    return MappedLocked(p);
  }
  bool MappedLocked(const float* p) const {
    auto it = mapped_.upper_bound(p);
    if (it == mapped_.begin()) return false;
    --it;
    return p < it->first + it->second;
  }
};

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_DEVICE_ROW_SPACE_H_
