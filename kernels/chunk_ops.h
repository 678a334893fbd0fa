// One layer's op table over one chunk of rows, the same for every model type: what a span's
// owner (engine/span_math.h) and a streamed forward (engine/model_stream.h) call, so that each is
// written once and both model types reach the device through one interface. Each type has one
// table over the backend's kernels: Mamba-1's (kernels/mamba_chunk_ops.h) over the backend's
// BlockBackend, Mamba-2's (kernels/mamba2_chunk_ops.h) over kernels/cpu/mamba2_layer.h or the
// backend's Mamba2BlockBackend.
//
// A chunk is rows [t0, t0 + len) of one layer; u holds the layer input's rows
// [t0 - halo, t0 + len), halo = min(W - 1, t0) (the causal conv's halo first). A state is what a
// chunk boundary carries (state_size values: (Di, N) for Mamba-1, (H, P, N) for Mamba-2), an
// adjoint its gradient. Pointers are in the model's row space (LayerModel::rows: host memory,
// or a GPU's for a resident model); calls may come from several threads at once (different
// chunks of different spans).
#ifndef ADJSH_KERNELS_CHUNK_OPS_H_
#define ADJSH_KERNELS_CHUNK_OPS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/row_space.h"

namespace adjsh {

struct ChunkSpan {
  int64_t t0 = 0, len = 0, halo = 0;
};

// How a chunk hands back the gradient of the conv halo rows it read (rows of earlier chunks).
enum class HaloGrad {
  // As rows of dL/du: Backward writes du_halo (halo, D), added to the earlier rows by the caller
  // in chunk order (Mamba-1, whose block takes the halo rows through in_proj itself).
  kRows,
  // As the conv input's gradient (conv_carry_size values) carried to the chunk before, which
  // takes it through its own in_proj; at a span's first chunk, HaloBackward takes what is left
  // through the earlier span's rows (Mamba-2).
  kCarried,
};

template <typename T, typename Layer>
class ChunkOps {
 public:
  using Kept = std::unique_ptr<KeptActs>;  // kernels/backend.h; null: nothing kept
  virtual ~ChunkOps() = default;

  virtual int64_t state_size() const = 0;
  virtual int64_t sigma_size() const = 0;  // Di: the delta sums a span's summary carries
  // Whether a span keeps every chunk's start state from its forward for the backward (small
  // states), or only the layer's start state, rebuilding the chunks' by a forward sweep when the
  // backward comes (a state as large as Mamba-2's would outweigh the rows).
  virtual bool keeps_chunk_states() const = 0;
  virtual HaloGrad halo_grad() const = 0;
  virtual int64_t conv_carry_size() const = 0;  // kCarried's buffer; 0 for kRows
  virtual Layer ZeroLayer() const = 0;          // a zero gradient accumulator

  // The forward summary folded over the chunk: state holds the state after the chunks before it
  // as if from zero at the span's start, and is left holding the one after it; sigma (Di) gets
  // the chunk's delta sums added (row order). Returns what it recomputed, kept for Forward on the
  // same rows within the backend's kept budget.
  virtual Kept FoldForward(const T* u, ChunkSpan c, T* state, T* sigma) = 0;
  // The chunk's forward from h0 (null: zero): out (len, D) = its rows of u^{k+1} (the residual
  // included), or null for h_end alone; h_end the state after it (may be h0). kept: what
  // FoldForward kept, or null. Returns what it carries to FoldAdjoint or Backward on the same
  // rows: nothing that would leave the budget without room for `room_for` summary sets of these
  // rows, nothing with room_for < 0 (no backward follows).
  virtual Kept Forward(Kept kept, const T* u, ChunkSpan c, const T* h0, T* out, T* h_end,
                       int64_t room_for) = 0;
  // The adjoint summary folded over the chunk: carry holds dL/d(state after it) from zero at the
  // span's end, and is left holding dL/d(state before it). h0: the state before it, g (len, D)
  // dL/du^{k+1} of its rows. carried: what Forward carried, or null. Returns what it recomputed,
  // kept for Backward.
  virtual Kept FoldAdjoint(Kept carried, const T* u, ChunkSpan c, const T* h0, const T* g,
                           T* carry) = 0;
  // The chunk's backward with the exact adjoint: mu (null: zero) dL/d(state after it), mu_out
  // dL/d(state before it) (may be mu); the layer's gradient accumulated into grad; du (len, D)
  // written. kRows: du_halo (halo, D) written; kCarried: conv_carry holds the conv input's
  // gradient from the later chunks and is left holding this chunk's part for the earlier rows.
  // sum: a resident model's (grad_size()), added into instead of grad (below).
  virtual void Backward(Kept kept, const T* u, ChunkSpan c, const T* h0, const T* g, const T* mu,
                        T* mu_out, T* conv_carry, Layer& grad, T* du, T* du_halo,
                        T* sum = nullptr) = 0;
  // kCarried: what conv_carry holds at a span's first chunk (t0), through the n = min(W - 1, t0)
  // rows before it (u (n, D)), into grad (or sum) and added to du (n, D). kRows: nothing.
  virtual void HaloBackward(const T* u, int64_t t0, const T* conv_carry, Layer& grad, T* du,
                            T* sum = nullptr) = 0;
  // After a task's Backward (and HaloBackward) calls into grad: the sum is in grad when this
  // returns (a device may keep it in its own memory until then).
  virtual void FinishBackward(Layer& grad) = 0;
  // A resident model's layer gradient stays where its rows are: a task's Backward and
  // HaloBackward calls add into `sum`, grad_size() values of the row space (the layer's tensors
  // back to back), where the step sums the spans' (engine/span_step.cc) or the span owner
  // brings it into grad's tensors with DownloadGrad (there once the space has finished).
  // FinishBackward is not called for such a sum. 0 and unused where the rows are the host's.
  virtual int64_t grad_size() const { return 0; }
  virtual void DownloadGrad(const T* /*sum*/, Layer& /*grad*/) {
    ADJSH_CHECK(false, "DownloadGrad of a model whose rows are the host's");
  }
};

// Where a model's spans keep their rows: host memory, or resident, in the device's own memory
// where the backend has it (Backend::ResidentRows: a GPU), so that no row crosses PCIe.
enum class RowPlace { kHost, kResident };

// A model's layers on a backend, shared by the spans of one step (read-only while they run).
// Params: ModelParams<T> or Mamba2Params<T>; both it and the backend outlive the model.
template <typename Params>
struct LayerModel {
  using Value = typename decltype(Params::embed)::value_type;
  using Layer = typename decltype(Params::layers)::value_type;
  const Params* params = nullptr;
  Backend<Value>* backend = nullptr;  // the LM head's, and the device's
  RowSpace<Value>* rows = &HostRows<Value>();  // where the ops' pointers are, or the backend's
  // Resident: the embedding and head on the device (Backend::MakeResidentHead); else null.
  std::shared_ptr<ResidentHead<Value>> head;
  std::vector<std::unique_ptr<ChunkOps<Value, Layer>>> layers;
};

// A model on a backend of its own (an in-process run: the span step, evaluation, decoding). The
// backend is on the heap, so the pair moves.
template <typename Params>
struct DeviceModel {
  std::unique_ptr<Backend<typename LayerModel<Params>::Value>> backend;
  LayerModel<Params> model;
};

}  // namespace adjsh

#endif  // ADJSH_KERNELS_CHUNK_OPS_H_
