// Where a process computes: the device (`--device cpu|cuda:N`) and, per device, a backend that
// runs one layer's block over one chunk (the unit of work of adjoint sharding) and the LM head.
// The CPU backend wraps kernels/cpu; the CUDA backend (kernels/cuda, built when nvcc is found)
// runs the same interface on one GPU. An operation a backend cannot do is refused up front with
// UNIMPLEMENTED naming the operation and the device (Require), never attempted.
#ifndef ADJSH_KERNELS_BACKEND_H_
#define ADJSH_KERNELS_BACKEND_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/check.h"
#include "common/config.h"
#include "common/device_memory.h"
#include "common/mamba2_config.h"
#include "common/model.h"
#include "kernels/cpu/kept_pool.h"
#include "kernels/cpu/lm_head.h"
#include "kernels/cpu/mamba_block.h"
#include "kernels/mamba2_tensors.h"
#include "kernels/row_space.h"

namespace adjsh {

struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // the GPU ordinal for kCuda
  // Activations and weights held in bf16 on the device, every sum in f32 (CUDA only; set from
  // --storage bf16, which on the CPU stores the engine's layer inputs instead: GradOptions).
  bool bf16_storage = false;
  // The budget in bytes of the activations the CPU backend keeps for the pass after a summary
  // (BlockBackend's *Keep and *Kept calls; set from --kept-mib: cli/device_flags.cc
  // DeviceFromFlags). The CPU backends of one budget share one store (kernels/cpu/kept_pool.h
  // KeptStore::Shared), so the sets one gradient's backend handed back are reused by the next.
  // Other devices keep nothing (ToString leaves it out).
  int64_t kept_budget = cpu::kDefaultKeptBudget;
  // The device memory in bytes a resident model's span rows may take (CUDA; set from
  // --device-mem-mib: cli/device_flags.cc); past it, rows live in mapped pinned host memory,
  // copied back a chunk ahead of their reader (kernels/cuda/device_row_space.h DeviceRowSpace).
  // < 0: 80% of the memory free at the first rows.
  int64_t row_budget = -1;

  bool is_cpu() const { return kind == Kind::kCpu; }
  std::string ToString() const;  // "cpu", "cuda:0", "cuda:0 (bf16 storage)"
};

// "cpu", "cuda" (= cuda:0) or "cuda:N" with 0 <= N < 1024. INVALID_ARGUMENT otherwise.
absl::StatusOr<Device> ParseDevice(std::string_view text);

enum class Op {
  kForward,             // chunk forward from h0 (the wavefront schedule)
  kLocalSummary,        // two-pass forward, pass one
  kAdjointSummary,      // two-pass backward, pass one
  kBackwardExact,       // chunk VJPs with the exact adjoint mu
  kBackwardTruncated,   // chunk VJPs with a truncated window (lookahead rows)
  kHead,                // final norm, tied LM head, cross-entropy and their backward
  kHeadAccuracy,        // the head's count of rows decoded right (LmHeadArgs::correct)
  kMamba2Layer,         // a Mamba-2 layer's chunk (kernels/mamba2_chunk_ops.h)
};
std::string_view OpName(Op op);

// What a chunk's summary recomputed, kept by the backend for the pass after it on the same rows
// (BlockBackend's *Keep and *Kept calls); opaque to the engine. Dropping it hands it back.
class KeptActs {
 public:
  virtual ~KeptActs() = default;
};

// One layer's block on one device. Same contracts as cpu::MambaBlockCpu (kernels/cpu/
// mamba_block.h); every pointer is host memory. Calls need not come from one thread.
template <typename T>
class BlockBackend {
 public:
  virtual ~BlockBackend() = default;
  virtual void Forward(const T* u, cpu::ChunkRows rows, const T* h0, T* u_next, T* h_end) = 0;
  virtual void LocalSummary(const T* u, cpu::ChunkRows rows, T* h_local, T* S) = 0;
  virtual void AdjointSummary(const T* u, cpu::ChunkRows rows, const T* g, T* m, T* S) = 0;
  // grad is accumulated; du (len, D) and du_halo (halo, D) written; mu_out (Di, N) written if
  // non-null (exact only).
  virtual void Backward(const T* u, cpu::ChunkRows rows, const T* g, const T* h0, const T* mu,
                        int64_t window, LayerParams<T>& grad, T* du, T* du_halo,
                        T* mu_out) = 0;

  // The summaries, keeping what they recomputed for the pass after them on the same rows
  // (LocalSummary's for Forward, AdjointSummary's, with the same g, for an exact Backward); the
  // span schedule runs both on one owner, one phase apart (engine/span_work.h). The pass given
  // it skips that recompute, with the same bits as without. Null: nothing kept (the backend
  // keeps none, or its store's budget is spent: Backend::KeptRefusals); the *Kept calls
  // take null as "recompute". ForwardKept returns what it carries on for the layer's
  // AdjointSummaryKeep or BackwardKept on the same rows (the rows' whole forward, so that pass
  // skips its recompute as well; cpu::MambaBlockCpu::Carries), or null; it carries nothing
  // that would leave the budget without room for `room_for` summary sets of these rows, and
  // nothing at all with room_for < 0 (no backward follows). Given no set (no summary ran before
  // it), it may recompute into a fresh one to carry. These defaults keep nothing.
  virtual std::unique_ptr<KeptActs> LocalSummaryKeep(const T* u, cpu::ChunkRows rows,
                                                     T* h_local, T* S) {
    LocalSummary(u, rows, h_local, S);
    return nullptr;
  }
  virtual std::unique_ptr<KeptActs> ForwardKept(std::unique_ptr<KeptActs> /*kept*/, const T* u,
                                                cpu::ChunkRows rows, const T* h0, T* u_next,
                                                T* h_end, int64_t /*room_for*/) {
    Forward(u, rows, h0, u_next, h_end);
    return nullptr;
  }
  virtual std::unique_ptr<KeptActs> AdjointSummaryKeep(std::unique_ptr<KeptActs> /*carried*/,
                                                       const T* u, cpu::ChunkRows rows,
                                                       const T* g, T* m, T* S) {
    AdjointSummary(u, rows, g, m, S);
    return nullptr;
  }
  virtual void BackwardKept(std::unique_ptr<KeptActs> /*kept*/, const T* u, cpu::ChunkRows rows,
                            const T* g, const T* h0, const T* mu, LayerParams<T>& grad, T* du,
                            T* du_halo, T* mu_out) {
    Backward(u, rows, g, h0, mu, 0, grad, du, du_halo, mu_out);
  }
  // As BackwardKept, for a task whose calls end with FinishBackward(grad): a device may keep the
  // sum in its own memory until then (grad holds it only after FinishBackward). The default adds
  // at once, as BackwardKept.
  virtual void BackwardDeferred(std::unique_ptr<KeptActs> kept, const T* u, cpu::ChunkRows rows,
                                const T* g, const T* h0, const T* mu, LayerParams<T>& grad,
                                T* du, T* du_halo, T* mu_out) {
    BackwardKept(std::move(kept), u, rows, g, h0, mu, grad, du, du_halo, mu_out);
  }
  virtual void FinishBackward(LayerParams<T>& /*grad*/) {}

  // A resident block's summaries (Backend::MakeResidentBlock), folded into a running value where
  // the rows are (kernels/decay.h DecayAdd with the layer's A): state = exp(A S) state +
  // h_local and sigma (Di) += S; carry = exp(A S) carry + m. A block of host rows has its chunk
  // ops fold on the host instead (kernels/mamba_chunk_ops.cc).
  virtual void FoldLocalSummary(const T* /*u*/, cpu::ChunkRows /*rows*/, T* /*state*/,
                                T* /*sigma*/) {
    ADJSH_CHECK(false, "FoldLocalSummary of a block of host rows");
  }
  virtual void FoldAdjointSummary(const T* /*u*/, cpu::ChunkRows /*rows*/, const T* /*g*/,
                                  T* /*carry*/) {
    ADJSH_CHECK(false, "FoldAdjointSummary of a block of host rows");
  }
  // A resident block's exact backward: the layer's gradient added into sum (the layer's values,
  // ChunkOps::grad_size, in the device's memory: norm, in_proj, conv_w, conv_b, x_proj, dt_w,
  // dt_b, A_log, Dskip, out_proj back to back), where the step's sums are taken.
  virtual void BackwardInto(const T* /*u*/, cpu::ChunkRows /*rows*/, const T* /*g*/,
                            const T* /*h0*/, const T* /*mu*/, T* /*sum*/, T* /*du*/,
                            T* /*du_halo*/, T* /*mu_out*/) {
    ADJSH_CHECK(false, "BackwardInto of a block of host rows");
  }
};

// A Mamba-2 layer's chunk on a device other than the CPU (whose layer is kernels/cpu/
// mamba2_layer.h's, called by kernels/mamba2_chunk_ops.cc): Forward with S (H, P, N) the states
// before t0 in and after out, out (L, D) the layer's addition or null, dt_sum (H) each head's dt
// summed over the rows (added to) or null; Adjoint, Backward and HaloBackward as
// Mamba2ChunkAdjoint, Mamba2ChunkBackward and Mamba2HaloBackward there, each recomputing the
// chunk's activations from u and S0; the layer's gradient as plain pointers
// (kernels/mamba2_tensors.h), its sum kept on the device across a task's Backward and
// HaloBackward calls until FinishBackward brings it into grad. Pointers are host memory.
template <typename T>
class Mamba2BlockBackend {
 public:
  virtual ~Mamba2BlockBackend() = default;
  virtual void Forward(const T* u, int64_t t0, int64_t t1, T* S, T* out, T* dt_sum) = 0;
  virtual void Adjoint(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout,
                       T* carry) = 0;
  virtual void Backward(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout,
                        T* carry, T* halo, const Mamba2Tensors<T>& grad, T* du) = 0;
  virtual void HaloBackward(const T* u, int64_t t0, const T* halo,
                            const Mamba2Tensors<T>& grad, T* du) = 0;
  virtual void FinishBackward(const Mamba2Tensors<T>& grad) = 0;

  // A resident block (Backend::MakeResidentMamba2Block): every pointer is ResidentRows()
  // memory; Forward and Adjoint as above (Forward with dt_sum null); FoldForward is Forward's
  // states alone with each head's dt sum added to sigma (Di: repeated over the head's P
  // channels); the gradient goes into sum (GradSize() values, the tensors back to back in
  // Mamba2Tensors order; ChunkOps::grad_size) instead of grad. Blocks of host rows refuse
  // these.
  virtual void FoldForward(const T* /*u*/, int64_t /*t0*/, int64_t /*t1*/, T* /*S*/,
                           T* /*sigma*/) {
    ADJSH_CHECK(false, "FoldForward of a block of host rows");
  }
  virtual void BackwardInto(const T* /*u*/, int64_t /*t0*/, int64_t /*t1*/, const T* /*S0*/,
                            const T* /*dout*/, T* /*carry*/, T* /*halo*/, T* /*sum*/,
                            T* /*du*/) {
    ADJSH_CHECK(false, "BackwardInto of a block of host rows");
  }
  virtual void HaloBackwardInto(const T* /*u*/, int64_t /*t0*/, const T* /*halo*/, T* /*sum*/,
                                T* /*du*/) {
    ADJSH_CHECK(false, "HaloBackwardInto of a block of host rows");
  }
};

// A resident model's embedding and head on the device (Backend::MakeResidentHead), made with the
// model, so that the (V, D) tables cross PCIe once per parameter version rather than per span: a
// resident span's first rows are gathered from it, its head runs against it and its lookup's
// gradient is summed there. Rows, u, du, g and the (V, D) partials dE are ResidentRows() memory
// (dE added into); ids, targets and dw_f host memory.
template <typename T>
class ResidentHead {
 public:
  virtual ~ResidentHead() = default;
  // ids, next_ids: the span's token ids where its rows are (ResidentRows() memory), uploaded
  // once per span, so that no task moves ids or targets.
  virtual void Gather(const uint32_t* ids, int64_t n, T* rows) = 0;  // rows (n, D) = embed[ids]
  // As Backend::HeadForwardBackward, with the head's own weights (args.E, args.w_f unread), row
  // t's target next_ids[t] for t < valid and none after (args.targets unread), and no greedy
  // count (args.correct unread: a backend with a resident head refuses kHeadAccuracy).
  // dE_nonfinite: null, or a host value set to 1 where dE holds a NaN or an Inf after the call
  // (kernels/row_space.h MarkNonFinite), found within the call's one wait.
  virtual double ForwardBackward(const cpu::LmHeadArgs<T>& args, const uint32_t* next_ids,
                                 int64_t valid, T* du, T* dE, T* dw_f, T* dE_nonfinite) = 0;
  // The loss alone (an evaluation's), ForwardBackward's bits without its backward; waits for it.
  virtual double Loss(const cpu::LmHeadArgs<T>& args, const uint32_t* next_ids,
                      int64_t valid) = 0;
  // dE (V, D) += the lookup's gradient: g[t] added into row ids[t] in token order.
  virtual void LookupBackward(const uint32_t* ids, int64_t n, const T* g, T* dE) = 0;
};

template <typename T>
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const Device& device() const = 0;
  virtual bool Supports(Op op) const = 0;
  // OK, or UNIMPLEMENTED: "<op> is not supported on <device>".
  absl::Status Require(Op op) const;
  // OK, or UNIMPLEMENTED when the model's shape is outside what the backend handles.
  virtual absl::Status CheckConfig(const MambaConfig&) const { return absl::OkStatus(); }

  // The block of one layer; config and params must outlive it (a device copy may be taken).
  virtual std::unique_ptr<BlockBackend<T>> MakeBlock(const MambaConfig& config,
                                                     const LayerParams<T>& params) = 0;
  // Where a resident model keeps its spans' rows (kernels/row_space.h): the device's memory, or
  // null where the host's is the device's (the CPU; this default). The backend owns it.
  virtual RowSpace<T>* ResidentRows() { return nullptr; }
  // A block whose calls take ResidentRows() pointers for every row, state and adjoint (null
  // where ResidentRows() is).
  virtual std::unique_ptr<BlockBackend<T>> MakeResidentBlock(const MambaConfig& /*config*/,
                                                             const LayerParams<T>& /*params*/) {
    return nullptr;
  }
  // A resident model's head (null where ResidentRows() is): embed and head (V, D), the same
  // pointer when tied, and w_f (D), copied.
  virtual std::unique_ptr<ResidentHead<T>> MakeResidentHead(const T* /*embed*/,
                                                            const T* /*head*/, const T* /*w_f*/,
                                                            int64_t /*V*/, int64_t /*D*/) {
    return nullptr;
  }
  // A Mamba-2 layer on the device (weights copied there when the backend keeps them); null
  // where the engine's own layer runs (the CPU) or the device has none (Supports says which).
  virtual std::unique_ptr<Mamba2BlockBackend<T>> MakeMamba2Block(
      const Mamba2Config& /*config*/, const Mamba2Tensors<const T>& /*weights*/) {
    return nullptr;
  }
  // A Mamba-2 layer taking ResidentRows() pointers (null where ResidentRows() is).
  virtual std::unique_ptr<Mamba2BlockBackend<T>> MakeResidentMamba2Block(
      const Mamba2Config& /*config*/, const Mamba2Tensors<const T>& /*weights*/) {
    return nullptr;
  }

  // The head over args.M rows (any M: the backend blocks rows and vocabulary itself, never
  // holding M x V logits): returns the rows' loss sum (as cpu::LmHeadForwardBackward); du (M, D)
  // written; dE (V, D) and dw_f (D) accumulated.
  virtual double HeadForwardBackward(const cpu::LmHeadArgs<T>& args, T* du, T* dE, T* dw_f) = 0;

  // The head's loss alone (evaluation): the rows' loss sum as HeadForwardBackward returns it
  // (args.correct counted likewise); no gradient. This default runs HeadForwardBackward into
  // scratch; a backend may do the forward alone.
  virtual double HeadLoss(const cpu::LmHeadArgs<T>& args);

  // The tied head's logits of M rows (decoding): logits (M, V) = rmsnorm(u; w_f) E^T. This
  // default computes on the host (any backend's inputs are host memory).
  virtual void HeadLogits(const T* u, int64_t M, int64_t D, int64_t V, double eps, const T* E,
                          const T* w_f, T* logits);

  // The memory this process holds on the backend's device, for the worker's GPU gauges
  // (common/device_memory.h): thread-safe, and valid after the backend is destroyed (it reads
  // per-device counts kept for the process's life). Empty on the CPU, whose memory the RSS
  // gauges already report; on CUDA used = the bytes of adjsh's allocations on the GPU now
  // (weights, workspaces), peak = the most since the process started.
  virtual DeviceMemoryProbe MemoryProbe() const { return {}; }
  // What the calling thread has moved between the host and this backend's device, synced and
  // allocated there since it started (common/device_memory.h): a task's traffic is the
  // difference of two readings around it on its thread. Zero on the CPU, which has none.
  virtual DeviceTraffic ThreadTraffic() const { return {}; }

  // The summaries' takes of a kept set its blocks' store has refused for the budget since the
  // store was made (kernels/cpu/kept_pool.h KeptTakes::refused; the store may be shared with
  // the process's other backends of the same budget: Device::kept_budget), for a schedule to
  // see whether the budget has run out between two readings (engine/span_step.cc). 0 for a
  // backend that keeps nothing (this default).
  virtual int64_t KeptRefusals() const { return 0; }
};

// The backend of `device` for compute type T (float or double). UNIMPLEMENTED for f64 on CUDA,
// bf16 storage on the CPU, or CUDA in a build without it; FAILED_PRECONDITION when the GPU is
// absent (no device, or the ordinal out of range).
template <typename T>
absl::StatusOr<std::unique_ptr<Backend<T>>> MakeBackend(const Device& device);

// The backend of `device` for T, checked to take `config` and to run each of `ops`: MakeBackend's
// errors, CheckConfig's, or Require's UNIMPLEMENTED naming the first op it lacks.
template <typename T>
absl::StatusOr<std::unique_ptr<Backend<T>>> MakeBackendFor(const Device& device,
                                                           const MambaConfig& config,
                                                           std::initializer_list<Op> ops);

// Whether this build has the CUDA backend.
bool CudaBuilt();

// Whether the backend of a device kind runs `op`, known without the device (false for every op
// of CUDA in a build without it).
bool KindSupports(Device::Kind kind, Op op);

}  // namespace adjsh

#endif  // ADJSH_KERNELS_BACKEND_H_
