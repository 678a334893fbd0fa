// Per-thread scratch buffers reused from call to call. A chunk's buffers are O(rows (D + Di))
// each; allocated afresh for every call they cost page faults (large blocks come from fresh
// mmaps) and a zero fill each, a large part of a single Mamba-1 gradient's time
// (docs/BENCHMARKS.md).
//
//   enum Slot { kA, kB, kSlots };                        // kSlots: the count
//   AlignedVector<T>& a = ThreadScratch<T>(kA, n);        // n elements, contents unspecified
//   AlignedVector<T>& b = ThreadScratch<T>(kB, n, true);  // n zeros
//
// Each (T, Slot) pair has its own buffers, so callers with different Slot enums never share
// one; a buffer stays valid until the same slot is asked for again on the same thread. Each
// starts on a cache line (aligned.h).
#ifndef ADJSH_KERNELS_CPU_SCRATCH_H_
#define ADJSH_KERNELS_CPU_SCRATCH_H_

#include <array>
#include <cstddef>
#include <vector>

#include "kernels/cpu/aligned.h"

namespace adjsh::cpu {

template <typename T, typename Slot>
AlignedVector<T>& ThreadScratch(Slot slot, size_t n, bool zero = false) {
  thread_local std::array<AlignedVector<T>, static_cast<size_t>(Slot::kSlots)> slots;
  AlignedVector<T>& v = slots[static_cast<size_t>(slot)];
  if (zero) {
    v.assign(n, T(0));
  } else {
    v.resize(n);
  }
  return v;
}

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_SCRATCH_H_
