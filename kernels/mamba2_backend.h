// A Mamba-2 model's layers on a device: what Mamba2SpanWork (engine/span_work.h, with engine/mamba2_span_math.h) calls
// for every chunk, so that a span's tasks reach the kernels through one interface whatever the
// device, as Mamba-1's reach them through BlockBackend (kernels/backend.h).
//
// Mamba2ChunkOps has the contracts of kernels/cpu/mamba2_layer.h, except that the chunk's
// activations do not cross calls: Adjoint and Backward recompute them from the chunk's rows u
// and the states before it (S0). The CPU's ops call the functions of kernels/cpu/mamba2_layer.h
// (the recompute is the forward the span work ran before each of them anyway, so the bits are
// those of the layer functions called in that order); a GPU's wrap the backend's
// Mamba2BlockBackend (kernels/cuda/mamba2_block.h).
#ifndef ADJSH_KERNELS_MAMBA2_BACKEND_H_
#define ADJSH_KERNELS_MAMBA2_BACKEND_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/mamba2_layer.h"
#include "common/mamba2_model.h"
#include "kernels/backend.h"

namespace adjsh {

// One layer over one chunk [t0, t1) with L = t1 - t0 rows. u holds the layer input's rows
// [t0 - hb, t1), hb = min(W - 1, t0) (the conv halo first). Calls may come from several
// threads at once (different chunks of different spans).
template <typename T>
class Mamba2ChunkOps {
 public:
  virtual ~Mamba2ChunkOps() = default;
  // S (H, P, N): the states before t0 in, after t1 - 1 out; out (L, D) the layer's addition
  // to its rows, or null for the states alone; dt_sum (H) or null: each head's dt (after the
  // softplus and clamp) summed over the chunk's rows in row order, added to.
  virtual void Forward(const T* u, int64_t t0, int64_t t1, T* S, T* out, T* dt_sum) = 0;
  // Mamba2ChunkAdjoint: carry (H, P, N) dL/dS_{t1-1} in, dL/dS_{t0-1} out; dout (L, D).
  virtual void Adjoint(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout,
                       T* carry) = 0;
  // Mamba2ChunkBackward: carry as Adjoint's; halo (W - 1, Cc) the conv-input gradient of rows
  // [t1 - W + 1, t1) in, of [t0 - W + 1, t0) out; grad accumulated; du (L, D) written.
  virtual void Backward(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout,
                        T* carry, T* halo, Mamba2Layer<T>& grad, T* du) = 0;
  // Mamba2HaloBackward: u (n, D) the rows [t0 - n, t0), n = min(W - 1, t0).
  virtual void HaloBackward(const T* u, int64_t t0, const T* halo, Mamba2Layer<T>& grad,
                            T* du) = 0;
};

// What a Mamba-2 model's steps need of a backend: a Mamba-2 layer (f32 storage on a GPU), the
// LM head, and with a loss mask the head's greedy accuracy. UNIMPLEMENTED naming what is
// missing. Checked before any model or data is fetched or made.
template <typename T>
absl::Status CheckMamba2Backend(const Backend<T>& backend, bool loss_mask);

// A Mamba-2 model on a backend, shared by the spans of one step (read-only while they run).
template <typename T>
struct Mamba2BackendModel {
  const Mamba2Params<T>* params = nullptr;
  Backend<T>* backend = nullptr;  // the LM head's, and the device's
  std::vector<std::unique_ptr<Mamba2ChunkOps<T>>> layers;
  // The layers of params on backend's device (both outlive the model): CheckMamba2Backend's
  // errors (without a loss mask).
  static absl::StatusOr<Mamba2BackendModel> Make(const Mamba2Params<T>& params,
                                                 Backend<T>& backend);
};

// A model on a backend of its own: what an in-process run (the span step, evaluation,
// decoding) makes of its params and device. The backend is on the heap, so the pair moves.
template <typename T>
struct Mamba2DeviceModel {
  std::unique_ptr<Backend<T>> backend;
  Mamba2BackendModel<T> model;
  // MakeBackend's errors, CheckMamba2Backend's (with loss_mask), then Mamba2BackendModel::Make's.
  static absl::StatusOr<Mamba2DeviceModel> Make(const Mamba2Params<T>& params,
                                                const Device& device, bool loss_mask = false);
};

}  // namespace adjsh

#endif  // ADJSH_KERNELS_MAMBA2_BACKEND_H_
