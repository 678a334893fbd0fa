// The non-scan kernels compiled for the GPU (their code is in ops_kernels.cuh).
#include "kernels/cuda/ops.h"

#include "kernels/cuda/context.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_kernels.cuh"

namespace adjsh::cuda {

template <typename S>
void RmsNormForward(cudaStream_t s, const float* u, int64_t rows, int64_t D, const float* w,
                    float eps, S* n, float* r) {
  ops_internal::RmsNormForwardImpl<S>(s, u, rows, D, w, eps, n, r);
}

void RmsNormBackward(cudaStream_t s, const float* u, int64_t rows, int64_t D, const float* w,
                     const float* r, const float* dn, float* dw, float* du, float* scratch) {
  ops_internal::RmsNormBackwardImpl(s, u, rows, D, w, r, dn, dw, du, scratch);
}

int64_t RmsNormBackwardScratch(int64_t rows, int64_t D) {
  return ops_internal::RmsNormBackwardScratchImpl(rows, D);
}

int64_t ConvSiluBackwardScratch(int64_t len, int64_t Di, int64_t W) {
  return ops_internal::ConvSiluBackwardScratchImpl(len, Di, W);
}

template <typename S>
void ConvSiluForward(cudaStream_t s, const S* xz, int64_t halo, int64_t M, int64_t Di, int64_t W,
                     const float* w, const float* b, S* cpre, S* xc) {
  ops_internal::ConvSiluForwardImpl<S>(s, xz, halo, M, Di, W, w, b, cpre, xc);
}

template <typename S>
void ConvSiluBackward(cudaStream_t s, const S* xz, const S* cpre, int64_t halo, int64_t len,
                      int64_t Di, int64_t W, const float* w, float* dxc, S* dxz, float* dw,
                      float* db, float* scratch) {
  ops_internal::ConvSiluBackwardImpl<S>(s, xz, cpre, halo, len, Di, W, w, dxc, dxz, dw, db,
                                        scratch);
}

template <typename S>
void Convert(cudaStream_t s, const float* in, int64_t n, S* out) {
  ops_internal::ConvertImpl<S>(s, in, n, out);
}

void Add(cudaStream_t s, const float* a, const float* b, int64_t n, float* out) {
  ops_internal::AddImpl(s, a, b, n, out);
}

void DecayFold(cudaStream_t s, const float* A, const float* S, const float* add, int64_t Di,
               int64_t N, float* v, float* sigma) {
  ops_internal::DecayFoldImpl(s, A, S, add, Di, N, v, sigma);
}

void GatherRows(cudaStream_t s, const float* table, const uint32_t* ids, int64_t n, int64_t D,
                float* rows) {
  ops_internal::GatherRowsImpl(s, table, ids, n, D, rows);
}

void ScatterAddRows(cudaStream_t s, const float* rows, const uint32_t* ids, int64_t n, int64_t D,
                    float* table) {
  ops_internal::ScatterAddRowsImpl(s, rows, ids, n, D, table);
}

void CopyFloats(cudaStream_t s, const float* src, int64_t n, float* dst) {
  ops_internal::CopyFloatsImpl(s, src, n, dst);
}

void ZeroFloats(cudaStream_t s, int64_t n, float* dst) { ops_internal::ZeroFloatsImpl(s, n, dst); }

void MarkNonFinite(cudaStream_t s, const float* src, int64_t n, float* flag) {
  ops_internal::MarkNonFiniteImpl(s, src, n, flag);
}

void WidenIds(cudaStream_t s, const uint16_t* packed, int64_t n, uint32_t* ids) {
  ops_internal::WidenIdsImpl(s, packed, n, ids);
}

void NextTargets(cudaStream_t s, const uint32_t* next_ids, int64_t valid, int64_t n,
                 int64_t* targets) {
  ops_internal::NextTargetsImpl(s, next_ids, valid, n, targets);
}

void CeLossAdd(cudaStream_t s, const float* mx, const float* sum, const float* tlogit,
               const int64_t* targets, int64_t M, double* loss) {
  ops_internal::CeLossAddImpl(s, mx, sum, tlogit, targets, M, loss);
}

void CeStats(cudaStream_t s, const float* logits, int64_t M, int64_t Vb, int64_t v0,
             const int64_t* targets, bool first, float* mx, float* sum, float* tlogit) {
  ops_internal::CeStatsImpl(s, logits, M, Vb, v0, targets, first, mx, sum, tlogit);
}

template <typename S>
void CeGrad(cudaStream_t s, const float* logits, int64_t M, int64_t Vb, int64_t v0,
            const int64_t* targets, const float* mx, const float* sum, float scale, S* dlogits) {
  ops_internal::CeGradImpl<S>(s, logits, M, Vb, v0, targets, mx, sum, scale, dlogits);
}

#define ADJSH_INSTANTIATE_OPS(S)                                                                \
  template void RmsNormForward<S>(cudaStream_t, const float*, int64_t, int64_t, const float*,   \
                                  float, S*, float*);                                           \
  template void ConvSiluForward<S>(cudaStream_t, const S*, int64_t, int64_t, int64_t, int64_t,  \
                                   const float*, const float*, S*, S*);                         \
  template void ConvSiluBackward<S>(cudaStream_t, const S*, const S*, int64_t, int64_t,         \
                                    int64_t, int64_t, const float*, float*, S*, float*, float*, \
                                    float*);                                                    \
  template void Convert<S>(cudaStream_t, const float*, int64_t, S*);                            \
  template void CeGrad<S>(cudaStream_t, const float*, int64_t, int64_t, int64_t,                \
                          const int64_t*, const float*, const float*, float, S*);
ADJSH_INSTANTIATE_OPS(float)
ADJSH_INSTANTIATE_OPS(bf16)
#undef ADJSH_INSTANTIATE_OPS

}  // namespace adjsh::cuda
