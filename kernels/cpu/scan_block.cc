// The channel-blocked scans (scan_block.h) on this build's native vectors and on the portable
// ones (simd.h).
#include "kernels/cpu/scan_block.h"

#include "kernels/cpu/scan_block_impl.h"

namespace adjsh::cpu {

template <typename T>
void ScanForward(const ScanInputs<T>& in, int64_t rows, const T* h0, const T* d_skip, T* h_end,
                 T* y) {
  blocked::Forward<simd::Native<T>>(in, rows, h0, d_skip, h_end, y);
}

template <typename T>
void ScanAdjointSummary(const ScanInputs<T>& in, int64_t len, const T* ybar, T* m) {
  blocked::AdjointSummary<simd::Native<T>>(in, len, ybar, m);
}

template <typename T>
void ScanBackward(const ScanInputs<T>& in, const ScanBackwardOptions& opt, const T* h0, const T* mu,
                  const T* ybar, const T* d_skip, const ScanGrads<T>& out) {
  blocked::Backward<simd::Native<T>>(in, opt, h0, mu, ybar, d_skip, out);
}

template <typename T>
void ScanForwardPortable(const ScanInputs<T>& in, int64_t rows, const T* h0, const T* d_skip,
                         T* h_end, T* y) {
  blocked::Forward<simd::Lanes<T, simd::kWidth<T>>>(in, rows, h0, d_skip, h_end, y);
}

template <typename T>
void ScanAdjointSummaryPortable(const ScanInputs<T>& in, int64_t len, const T* ybar, T* m) {
  blocked::AdjointSummary<simd::Lanes<T, simd::kWidth<T>>>(in, len, ybar, m);
}

template <typename T>
void ScanBackwardPortable(const ScanInputs<T>& in, const ScanBackwardOptions& opt, const T* h0,
                          const T* mu, const T* ybar, const T* d_skip, const ScanGrads<T>& out) {
  blocked::Backward<simd::Lanes<T, simd::kWidth<T>>>(in, opt, h0, mu, ybar, d_skip, out);
}

#define ADJSH_INSTANTIATE_SCAN_BLOCK_AS(T, S)                                                  \
  template void ScanForward##S<T>(const ScanInputs<T>&, int64_t, const T*, const T*, T*, T*);  \
  template void ScanAdjointSummary##S<T>(const ScanInputs<T>&, int64_t, const T*, T*);         \
  template void ScanBackward##S<T>(const ScanInputs<T>&, const ScanBackwardOptions&, const T*, \
                                   const T*, const T*, const T*, const ScanGrads<T>&);
#define ADJSH_INSTANTIATE_SCAN_BLOCK(T) \
  ADJSH_INSTANTIATE_SCAN_BLOCK_AS(T, )  \
  ADJSH_INSTANTIATE_SCAN_BLOCK_AS(T, Portable)
ADJSH_INSTANTIATE_SCAN_BLOCK(float)
ADJSH_INSTANTIATE_SCAN_BLOCK(double)
#undef ADJSH_INSTANTIATE_SCAN_BLOCK
#undef ADJSH_INSTANTIATE_SCAN_BLOCK_AS

}  // namespace adjsh::cpu
