// Mamba-2's layer op table (kernels/chunk_ops.h): on the CPU the functions of
// kernels/cpu/mamba2_layer.h, on a GPU the backend's Mamba2BlockBackend (kernels/backend.h).
// A summary runs the chunk from the state before it (the state's decay is per head, and the
// chunked forward is already the cheapest way through it); a span rebuilds its chunks' start
// states when its backward comes (an (H, P, N) state per chunk would outweigh the rows); the
// conv halo's gradient is carried to the chunk before in the conv input's space (kCarried).
// FoldAdjoint and Backward recompute the chunk's activations from its rows u and the state
// before it, h0 (the recompute is the forward the span work ran before each of them anyway, so
// the bits are those of the layer functions called in that order).
#ifndef ADJSH_KERNELS_MAMBA2_CHUNK_OPS_H_
#define ADJSH_KERNELS_MAMBA2_CHUNK_OPS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mamba2_model.h"
#include "kernels/backend.h"
#include "kernels/chunk_ops.h"

namespace adjsh {

// What a Mamba-2 model's steps need of a backend: a Mamba-2 layer (f32 storage on a GPU), the
// LM head, and with a loss mask the head's greedy accuracy. UNIMPLEMENTED naming what is
// missing. Checked before any model or data is fetched or made.
template <typename T>
absl::Status CheckMamba2Backend(const Backend<T>& backend, bool loss_mask);

// The layers of params on backend (both outlive the model): CheckMamba2Backend's errors
// (without a loss mask); resident: their rows in the backend's ResidentRows() where it has them
// (a GPU), else the host's.
template <typename T>
absl::StatusOr<LayerModel<Mamba2Params<T>>> MakeLayerModel(const Mamba2Params<T>& params,
                                                           Backend<T>& backend,
                                                           RowPlace place = RowPlace::kHost);

// The device's backend with the layers of params on it: MakeBackend's errors,
// CheckMamba2Backend's (with loss_mask), then MakeLayerModel's.
template <typename T>
absl::StatusOr<DeviceModel<Mamba2Params<T>>> MakeDeviceModel(const Mamba2Params<T>& params,
                                                             const Device& device,
                                                             bool loss_mask = false,
                                                             RowPlace place = RowPlace::kHost);

}  // namespace adjsh

#endif  // ADJSH_KERNELS_MAMBA2_CHUNK_OPS_H_
