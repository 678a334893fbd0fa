// The host-emulated GPU's memory (emulated_device.h): one reserved range of address space,
// allocated first-fit at 256-byte alignment, that the host can read and write only while the
// emulated device is at work: a kernel, a GEMM, a copy or a memset holds a DeviceAccess, and
// outside them the range is PROT_NONE. A GPU's memory is not the host's: host code that reads a
// device pointer (a copy forgotten, a host loop over a resident buffer) runs here on a plain
// host build, and would read garbage or fault on a GPU; here it faults at once, and the handler
// names it. Device work is serialised by the context's mutex, so the range is open only while
// one call's device work runs; a host read on another thread in that window is not caught.
//
// `guard_device_memory = false` (set before the first allocation) leaves the range readable:
// the benchmarks' large emulated steps, where a protection change per launch would cost more
// than the kernels they skip (bench/emulated_step.cc).
#ifndef ADJSH_TESTS_CUDA_EMULATED_MEMORY_H_
#define ADJSH_TESTS_CUDA_EMULATED_MEMORY_H_

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

namespace adjsh::emulation {

inline bool guard_device_memory = true;

class DeviceArena {
 public:
  static DeviceArena& Get() {
    static DeviceArena* arena = new DeviceArena();  // never destroyed: threads may outlive main
    return *arena;
  }

  // `bytes` of device memory (at least 1), filled with `fill`: 0xff gives NaN floats, as fresh
  // device memory holds whatever was there.
  void* Alloc(size_t bytes, int fill = 0xff) {
    const size_t n = Round(bytes == 0 ? 1 : bytes, kAlign);
    std::lock_guard<std::mutex> lock(mu_);
    size_t at = high_;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < n) continue;
      at = it->first;
      if (it->second > n) free_.emplace(it->first + n, it->second - n);
      free_.erase(it);
      break;
    }
    if (at == high_) Grow(at + n);
    live_.emplace(at, n);
    live_bytes_ += n;
    Unprotected(base_ + at, n, [&] { std::memset(base_ + at, fill, n); });
    return base_ + at;
  }

  // Frees what Alloc returned (aborts on anything else: a bug a GPU's allocator reports too).
  void Free(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(static_cast<size_t>(static_cast<char*>(p) - base_));
    if (!Inside(p) || it == live_.end()) {
      std::fprintf(stderr, "emulated device: free of %p, which no allocation returned\n", p);
      std::abort();
    }
    size_t at = it->first, n = it->second;
    live_.erase(it);
    live_bytes_ -= n;
    if (n >= (size_t{1} << 20)) {  // its whole pages back to the system: the RSS stays bounded
      const size_t lo = Round(at, page_), hi = (at + n) / page_ * page_;
      if (hi > lo) madvise(base_ + lo, hi - lo, MADV_DONTNEED);
    }
    auto next = free_.lower_bound(at);
    if (next != free_.end() && next->first == at + n) n += next->second, next = free_.erase(next);
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) at = prev->first, n += prev->second, free_.erase(prev);
    }
    free_.emplace(at, n);
  }

  // Whether [p, p + n) lies inside one live allocation.
  bool Contains(const void* p, size_t n) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Inside(p)) return false;
    const size_t off = static_cast<size_t>(static_cast<const char*>(p) - base_);
    auto it = live_.upper_bound(off);
    if (it == live_.begin()) return false;
    --it;
    return off + n <= it->first + it->second;
  }
  size_t live_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_bytes_;
  }
  bool Inside(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + kReserved;
  }

  // The device at work: the range readable until the matching Close.
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_++ == 0) Protect(PROT_READ | PROT_WRITE);
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--open_ == 0) Protect(PROT_NONE);
  }

 private:
  static constexpr size_t kReserved = size_t{256} << 30;  // address space only (NORESERVE)
  static constexpr size_t kAlign = 256;                   // cudaMalloc's alignment

  DeviceArena() {
    void* p = mmap(nullptr, kReserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
      std::perror("emulated device: reserving its address range");
      std::abort();
    }
    base_ = static_cast<char*>(p);
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    InstallHandler(base_, kReserved);
  }
  static size_t Round(size_t n, size_t to) { return (n + to - 1) / to * to; }

  bool Guarded() const { return guard_device_memory && open_ == 0; }
  void Protect(int prot) {
    if (guard_device_memory && mapped_ > 0 && mprotect(base_, mapped_, prot) != 0) {
      std::perror("emulated device: mprotect");
      std::abort();
    }
  }
  // The range grows to `end` bytes: its new pages readable now unless guarded.
  void Grow(size_t end) {
    if (end > kReserved) {
      std::fprintf(stderr, "emulated device: out of its %zu GiB of memory\n", kReserved >> 30);
      std::abort();
    }
    high_ = end;
    const size_t mapped = Round(end, page_);
    if (mapped <= mapped_) return;
    if (!Guarded() && mprotect(base_ + mapped_, mapped - mapped_, PROT_READ | PROT_WRITE) != 0) {
      std::perror("emulated device: mprotect");
      std::abort();
    }
    mapped_ = mapped;
  }
  // Runs fn with [p, p + n) writable (under mu_), guarded again after.
  template <typename Fn>
  void Unprotected(char* p, size_t n, Fn fn) {
    if (!Guarded()) return fn();
    char* lo = base_ + (static_cast<size_t>(p - base_) / page_) * page_;
    const size_t len = Round(static_cast<size_t>(p + n - lo), page_);
    mprotect(lo, len, PROT_READ | PROT_WRITE);
    fn();
    mprotect(lo, len, PROT_NONE);
  }

  // A fault inside the range is host code touching device memory: named, then the default
  // action (the test dies with its message). Anything else goes to the handler before ours.
  static void InstallHandler(const char* base, size_t size) {
    range_base = base, range_size = size;
    struct sigaction sa {};
    sa.sa_sigaction = OnFault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous);
  }
  static void OnFault(int sig, siginfo_t* info, void* uc) {
    const char* at = static_cast<const char*>(info->si_addr);
    if (at >= range_base && at < range_base + range_size) {
      static const char kMsg[] =
          "emulated device: host code read or wrote device memory outside a kernel, GEMM or "
          "copy (a GPU's memory is not the host's)\n";
      (void)!write(2, kMsg, sizeof(kMsg) - 1);
      signal(SIGSEGV, SIG_DFL);
      return;  // the access faults again, now with the default action
    }
    if (previous.sa_flags & SA_SIGINFO && previous.sa_sigaction != nullptr) {
      previous.sa_sigaction(sig, info, uc);
    } else if (previous.sa_handler != SIG_IGN && previous.sa_handler != SIG_DFL &&
               previous.sa_handler != nullptr) {
      previous.sa_handler(sig);
    } else {
      signal(SIGSEGV, SIG_DFL);
    }
  }
  static inline const char* range_base = nullptr;
  static inline size_t range_size = 0;
  static inline struct sigaction previous {};

  mutable std::mutex mu_;
  char* base_ = nullptr;
  size_t page_ = 4096;
  size_t high_ = 0;    // the end of the highest allocation ever
  size_t mapped_ = 0;  // high_ rounded up to pages: what Protect changes
  int open_ = 0;
  size_t live_bytes_ = 0;
  std::map<size_t, size_t> live_, free_;  // offset -> bytes
};

// The emulated device at work for one scope (a launch, a GEMM, a copy, a memset).
class DeviceAccess {
 public:
  DeviceAccess() { DeviceArena::Get().Open(); }
  ~DeviceAccess() { DeviceArena::Get().Close(); }
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

}  // namespace adjsh::emulation

#endif  // ADJSH_TESTS_CUDA_EMULATED_MEMORY_H_
