// Vectors whose data start on a 64-byte boundary: a cache line, and one 512-bit vector.
//
// glibc's malloc returns 16-byte aligned blocks; a large one (a fresh mmap) starts 16 bytes past
// a page. In a (rows, Di) f32 array from std::vector every 64-byte vector at a channel block
// i0 = 16 j then straddled two cache lines: the scans' column loads (scan_block_impl.h) and
// every full-width load and store of the element-wise loops and the packed GEMMs touched two
// lines for one. The kernels' activations and scratch use AlignedVector instead; the values
// and the arithmetic are the same, so are the bits.
//
//   AlignedVector<float> v(n);   // v.data() % 64 == 0
#ifndef ADJSH_KERNELS_CPU_ALIGNED_H_
#define ADJSH_KERNELS_CPU_ALIGNED_H_

#include <cstddef>
#include <new>
#include <vector>

namespace adjsh::cpu {

inline constexpr std::size_t kLineBytes = 64;

template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kLineBytes)));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(kLineBytes)); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const {
    return true;
  }
};

template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_ALIGNED_H_
