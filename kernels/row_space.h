// Where a span's rows, states and adjoints live while its owner works on them: host memory (the
// CPU, and every call whose pointers are host memory) or one GPU's memory (a resident model:
// kernels/chunk_ops.h LayerModel::rows). The span owner and its layer math (engine/span_work.h,
// engine/span_math.h) do what they do between kernel calls (copies, sums of halo rows, the few
// values a task sends or receives) through the space, so that the same code runs on both and
// nothing proportional to the sequence crosses PCIe on a GPU.
//
// Calls are queued in order with the device's kernel calls, on its one stream; what Download
// writes to the host is there after Finish, which the span owner calls at the end of a task
// (the task's one host sync on a GPU; a task that waited already, the resident head's, skips
// it). A buffer freed while work that uses it is still queued may be reused at once: the next
// user's work is queued after it on the same stream. Thread-safe: spans run on several threads
// at once.
#ifndef ADJSH_KERNELS_ROW_SPACE_H_
#define ADJSH_KERNELS_ROW_SPACE_H_

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace adjsh {

template <typename T>
class RowSpace {
 public:
  // pooled_bytes: how much of what is freed the space keeps for reuse (0: none).
  explicit RowSpace(size_t pooled_bytes) : pool_cap_(pooled_bytes) {}
  virtual ~RowSpace() = default;
  // Whether the host may read and write its pointers.
  virtual bool host() const = 0;

  // n values, uninitialised. A freed buffer of the same size is reused while the pool has room
  // (a span's tasks take and give back buffers every task: states, a (len, D) cotangent, and a
  // GPU's allocation or free is a device-wide wait); past the pool, a freed buffer goes at the
  // space's next wait (AfterWait), when nothing queued can use it. may_spill: what grows with
  // the span or the number of spans (stored rows, cotangents, a span's (V, D) partial), which a
  // device may keep in host memory past its budget (kernels/cuda/device_row_space.h
  // DeviceRowSpace); the rest (states, a layer's partial sums) stays in the device's memory.
  T* Alloc(size_t n, bool may_spill = false);
  void Free(T* p, size_t n);

  virtual void Upload(T* dst, const T* host_src, size_t n) = 0;
  virtual void Download(T* host_dst, const T* src, size_t n) = 0;  // on the host after Finish
  virtual void Copy(T* dst, const T* src, size_t n) = 0;
  virtual void Add(T* dst, const T* src, size_t n) = 0;  // dst[i] += src[i], one f32/f64 add each
  virtual void Zero(T* dst, size_t n) = 0;
  // flag[0] = 1 where any of src[0, n) is NaN or infinite; otherwise flag is left as it was.
  virtual void MarkNonFinite(T* flag, const T* src, size_t n) = 0;
  // Token ids: ids[i] (a uint32 in T's bytes) = the i-th uint16 packed in `packed`, for i < n
  // (ids cross PCIe at 2 B each where the vocabulary fits 16 bits).
  virtual void WidenIds(T* ids, const T* packed, size_t n) = 0;
  virtual void Finish() = 0;
  // Where the device's kernels best read p[0, n), valid until the next call with the same key
  // (the caller's scratch: one per thread and use). p itself, unless p lies past a device's
  // budget, in host memory (kernels/cuda/device_row_space.h DeviceRowSpace): then a device copy.
  // next: the next_n values the caller reads next with the key (null: none), whose copy may
  // start now, so that it overlaps the work queued before the next call; nothing may write them
  // meanwhile.
  virtual const T* ReadRows(const T* p, size_t n, const void* key, const T* next,
                            size_t next_n) {
    (void)n, (void)key, (void)next, (void)next_n;
    return p;
  }

 protected:
  virtual T* Allocate(size_t n) = 0;
  virtual T* AllocateSpillable(size_t n) { return Allocate(n); }
  virtual bool Spilled(const T* p) const {  // whether p is past the budget
    (void)p;
    return false;
  }
  virtual void Release(T* p, size_t n) = 0;  // nothing queued uses p
  // After the space waited for its device (Finish): the buffers freed past the pool go.
  void AfterWait();
  // Frees what the pool keeps and what waits to go (a device space's destructor, after a wait).
  void Drain();

 private:
  const size_t pool_cap_;
  size_t pooled_ = 0;  // bytes in pool_
  std::mutex mu_;
  struct Pooled {
    T* p;
    bool spilled;
  };
  std::multimap<size_t, Pooled> pool_;
  std::vector<std::pair<T*, size_t>> pending_;  // freed past the pool, until the next wait
};

// The host's space, which pools nothing (never destroyed: a thread's buffers freed at its exit
// still find it).
template <typename T>
RowSpace<T>& HostRows();

// n values of a space, owned; moves, never copies.
template <typename T>
class RowBuffer {
 public:
  RowBuffer() = default;
  RowBuffer(RowSpace<T>& space, size_t n, bool may_spill = false)
      : space_(&space), n_(n), p_(n ? space.Alloc(n, may_spill) : nullptr) {}
  ~RowBuffer() { reset(); }
  RowBuffer(RowBuffer&& o) noexcept { *this = std::move(o); }
  RowBuffer& operator=(RowBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(space_, o.space_), std::swap(n_, o.n_), std::swap(p_, o.p_);
    }
    return *this;
  }
  RowBuffer(const RowBuffer&) = delete;
  RowBuffer& operator=(const RowBuffer&) = delete;

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  void reset() {
    if (p_) space_->Free(p_, n_);
    p_ = nullptr, n_ = 0;
  }

 private:
  RowSpace<T>* space_ = nullptr;
  size_t n_ = 0;
  T* p_ = nullptr;
};

}  // namespace adjsh

#endif  // ADJSH_KERNELS_ROW_SPACE_H_
