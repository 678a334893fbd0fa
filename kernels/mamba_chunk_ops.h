// Mamba-1's layer op table (kernels/chunk_ops.h) over the backend's block (kernels/backend.h
// BlockBackend): a summary is the chunk's local summary (the state from zero and the delta sums
// S_c) combined with the state before it through the layer's decay rates, exp(A S_c) h + h_local
// (kernels/decay.h); the backward hands the conv halo's gradient back as rows of du (kRows); the
// activations a summary recomputed are kept for the pass after it within the backend's kept
// budget (kernels/cpu/kept_pool.h), so that pass skips its recompute with the same bits.
#ifndef ADJSH_KERNELS_MAMBA_CHUNK_OPS_H_
#define ADJSH_KERNELS_MAMBA_CHUNK_OPS_H_

#include <initializer_list>

#include "absl/status/statusor.h"
#include "common/model.h"
#include "kernels/backend.h"
#include "kernels/chunk_ops.h"

namespace adjsh {

// The layers of params on backend (both outlive the model); resident: their rows in the
// backend's ResidentRows() where it has them (a GPU), else the host's.
template <typename T>
LayerModel<ModelParams<T>> MakeLayerModel(const ModelParams<T>& params, Backend<T>& backend,
                                          RowPlace place = RowPlace::kHost);

// The device's backend, checked to take the config and to run `ops` (MakeBackendFor's errors),
// with the layers of params on it.
template <typename T>
absl::StatusOr<DeviceModel<ModelParams<T>>> MakeDeviceModel(const ModelParams<T>& params,
                                                             const Device& device,
                                                             std::initializer_list<Op> ops);

}  // namespace adjsh

#endif  // ADJSH_KERNELS_MAMBA_CHUNK_OPS_H_
