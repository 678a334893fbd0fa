// The plain, slow reference: the whole model's forward and backward over the whole sequence,
// keeping every activation (including the (T, Di, N) states of every layer), written
// independently of the chunked kernels with plain loops and libm. It is the in-repo oracle the
// adjoint engine is checked against, and the "backprop, everything kept" memory baseline.
#ifndef ADJSH_KERNELS_REFERENCE_MAMBA_REFERENCE_H_
#define ADJSH_KERNELS_REFERENCE_MAMBA_REFERENCE_H_

#include <cstdint>
#include <span>

#include "common/model.h"

namespace adjsh::reference {

template <typename T>
struct ReferenceResult {
  double loss = 0;
  ModelParams<T> grad;
};

// Mean next-token loss and its gradient. window = 0: exact backpropagation; window = Wt > 0:
// the truncated adjoint lambda_tau = sum_{t = tau}^{tau + Wt - 1} (prod_{tau < j <= t} a_j) ybar_t
// C_t, summed directly. tokens: at least 2, all < V (the caller checks).
template <typename T>
ReferenceResult<T> ReferenceGradient(const ModelParams<T>& params, std::span<const uint32_t> tokens,
                                     int64_t window);

}  // namespace adjsh::reference

#endif  // ADJSH_KERNELS_REFERENCE_MAMBA_REFERENCE_H_
