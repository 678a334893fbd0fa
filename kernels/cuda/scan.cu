// The scan kernels compiled for the GPU (their code is in scan_kernels.cuh).
#include "kernels/cuda/context.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/scan_kernels.cuh"

namespace adjsh::cuda {

int64_t ScanForwardScratch(int64_t len, int64_t Di, int64_t N) {
  return scan_internal::ScanForwardScratchImpl(len, Di, N);
}

int64_t ScanBackwardScratch(int64_t len, int64_t Di, int64_t N) {
  return scan_internal::ScanBackwardScratchImpl(len, Di, N);
}

template <typename S>
void ScanForward(cudaStream_t s, const ScanArgs<S>& a, const float* h0, float* h_end, S* o,
                 float* scratch) {
  scan_internal::ScanForwardImpl<S>(s, a, h0, h_end, o, scratch);
}

int64_t ScanSummaryScratch(int64_t len, int64_t Di, int64_t N) {
  return scan_internal::ScanSummaryScratchImpl(len, Di, N);
}

template <typename S>
void ScanSummary(cudaStream_t s, const ScanArgs<S>& a, const float* d_o, float* h_local,
                 float* m, float* dt_total, float* scratch) {
  scan_internal::ScanSummaryImpl<S>(s, a, d_o, h_local, m, dt_total, scratch);
}

template <typename S>
void ScanBackward(cudaStream_t s, const ScanArgs<S>& a, const ScanBackwardArgs<S>& b) {
  scan_internal::ScanBackwardImpl<S>(s, a, b);
}

template void ScanForward<float>(cudaStream_t, const ScanArgs<float>&, const float*, float*,
                                 float*, float*);
template void ScanForward<bf16>(cudaStream_t, const ScanArgs<bf16>&, const float*, float*, bf16*,
                                float*);
template void ScanSummary<float>(cudaStream_t, const ScanArgs<float>&, const float*, float*,
                                 float*, float*, float*);
template void ScanSummary<bf16>(cudaStream_t, const ScanArgs<bf16>&, const float*, float*, float*,
                                float*, float*);
template void ScanBackward<float>(cudaStream_t, const ScanArgs<float>&,
                                  const ScanBackwardArgs<float>&);
template void ScanBackward<bf16>(cudaStream_t, const ScanArgs<bf16>&,
                                 const ScanBackwardArgs<bf16>&);

}  // namespace adjsh::cuda
