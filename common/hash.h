// Small fixed hashes, the same on every platform: what seeds and fingerprints are made of.
#ifndef ADJSH_COMMON_HASH_H_
#define ADJSH_COMMON_HASH_H_

#include <cstdint>

namespace adjsh {

// SplitMix64's finaliser: spreads a 64-bit value over all 64 bits.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a, 64-bit: the offset basis, and one byte folded in.
inline constexpr uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;
inline uint64_t Fnv1a(uint64_t h, uint8_t byte) { return (h ^ byte) * 0x100000001b3ull; }

}  // namespace adjsh

#endif  // ADJSH_COMMON_HASH_H_
