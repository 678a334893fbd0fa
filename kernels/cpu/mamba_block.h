// One Mamba layer over one chunk of tokens on the CPU: the unit of work of adjoint sharding.
// A task sees rows of the layer input u (outermost first):
//   [halo rows | len own rows | ahead rows]      each row (D)
// halo = min(W - 1, first token) rows before the chunk feed its causal conv; ahead rows (the
// truncated adjoint's lookahead, backward only) follow it. Everything inside a task is
// recomputed from u, so a task's memory is O(rows (D + Di) + Di N), independent of T.
// Letters: D width, Di inner, N state, R dt rank, W conv kernel.
#ifndef ADJSH_KERNELS_CPU_MAMBA_BLOCK_H_
#define ADJSH_KERNELS_CPU_MAMBA_BLOCK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/config.h"
#include "common/model.h"
#include "kernels/cpu/gemm_packed.h"

namespace adjsh::cpu {

class KeptStore;  // kernels/cpu/kept_pool.h
template <typename Obj>
class KeptPool;
template <typename T, int kRoles>
class KeptSpares;  // kernels/cpu/kept_spares.h

struct ChunkRows {
  int64_t halo = 0, len = 0, ahead = 0;
};

template <typename T>
class MambaBlockCpu {
 public:
  // What a chunk's summary recomputed, kept for the pass after it on the same rows (the span
  // schedule runs both on one owner, one phase apart: engine/span_work.h): LocalSummary's for
  // Forward, AdjointSummary's for an exact Backward. A pass given one skips that recompute and
  // returns the same bits as without it (the same calls on the same rows made them). They come
  // from the pool of the block's store under its budget (kernels/cpu/kept_pool.h KeptStore,
  // given at construction); dropping one hands it back to that store. MakeKept: an empty one,
  // or null when the budget is spent or the block has no store (then recompute).
  // A set Forward took goes on, when the budget allows (kept_pool.h TryCarry), holding every
  // activation of the rows' forward: the layer's AdjointSummary (or Backward) on the same rows,
  // a whole forward and head later, then skips its recompute too (Carries says whether it does).
  // While carried it holds only what the rest cannot give back exactly and cheaply (RMSNorm's r,
  // x|z, the conv output, d|B|C and dt_proj's pre-activation: 54% of a whole set at D = 256);
  // the arrays it gives up wait for the next set among the spares (kernels/cpu/kept_spares.h).
  struct Kept;
  struct KeptReturn {
    void operator()(Kept* k) const;
  };
  using KeptPtr = std::unique_ptr<Kept, KeptReturn>;
  KeptPtr MakeKept(ChunkRows rows) const;
  int64_t SetBytes(ChunkRows rows) const;  // what MakeKept counts a set of these rows as
  // For a Forward with no LocalSummary set (a span schedule's last span runs no LocalSummary,
  // and a summary may have been refused one): an empty set for Forward to recompute into and
  // carry, or null when a carry of it would not fit now (Forward's room_for; never with
  // room_for < 0), the budget has no set to give, or the block has no store. Not counted as a
  // summary's take.
  KeptPtr MakeKeptToCarry(ChunkRows rows, int64_t room_for) const;

  // kept: the store its kept sets come from and count in (it outlives the block and every set
  // taken); null keeps none. A CPU backend gives its blocks its own (kernels/backend.cc).
  MambaBlockCpu(const MambaConfig& config, const LayerParams<T>& params,
                KeptStore* kept = nullptr);

  // Forward pass one (two-pass forward): the scan from a zero state. h_local (Di, N) is the
  // chunk's state contribution, S (Di) = sum_t Delta_t, so that P_c = exp(A S) and
  // h_end(c) = P_c . h_end(c - 1) + h_local(c). The scan needs no gate, so only the x half of
  // in_proj is computed (the same x bits as the full product: tests/kernels/mamba_block_test.cc).
  // keep, if non-null (from MakeKept(rows)), receives the activations Forward reads.
  void LocalSummary(const T* u, ChunkRows rows, T* h_local, T* S, Kept* keep = nullptr) const;

  // Forward from the true initial state h0 (Di, N): u_next (len, D) = u + out_proj(...), and the
  // final state h_end (Di, N). kept: null, or what LocalSummary kept of these rows, or an empty
  // set (MakeKeptToCarry) to recompute into; afterwards it is carried (Carries) if the budget
  // has room for it, for the sets already carried, and for `room_for` more sets of these rows
  // (the summaries' that may be kept at once); else, or with room_for < 0 (no backward
  // follows), empty.
  void Forward(const T* u, ChunkRows rows, const T* h0, T* u_next, T* h_end,
               Kept* kept = nullptr, int64_t room_for = 0) const;

  // Backward pass one (exact scheme): with g = dL/du_next (len, D), the local adjoint summary
  // m (Di, N) = a_first . lambda_local_first and S (Di) as above; the engine then combines
  // mu_{c-1} = m_c + exp(A S_c) . mu_c.
  // keep: as LocalSummary's, receiving what an exact Backward of these rows reads; a set
  // Forward carried for these rows already holds what it is made from.
  void AdjointSummary(const T* u, ChunkRows rows, const T* g, T* m, T* S,
                      Kept* keep = nullptr) const;

  // Backward pass two: the chunk's VJPs. g = dL/du_next (len + ahead, D); h0 (Di, N) the state
  // before the chunk; mu (Di, N) the adjoint flowing in from later chunks (exact: window == 0;
  // nullptr = zero) or, with window = Wt > 0, the truncated adjoint computed from the lookahead.
  // grad (this layer's parameters) is accumulated; du (len, D) = g + dL/du through the block;
  // du_halo (halo, D) is this chunk's contribution to the previous rows' dL/du; mu_out (Di, N),
  // if non-null (exact only), the adjoint a_first . lambda_first flowing into the previous chunk.
  // kept: null, or what AdjointSummary kept of these rows with this g, or what Forward carried
  // of them (exact only; consumed).
  void Backward(const T* u, ChunkRows rows, const T* g, const T* h0, const T* mu, int64_t window,
                LayerParams<T>& grad, T* du, T* du_halo, T* mu_out = nullptr,
                Kept* kept = nullptr) const;

  // Whether kept holds what Forward carried of these rows.
  bool Carries(const Kept* kept, ChunkRows rows) const;
  // Whether kept holds what AdjointSummary kept of these rows for Backward (not so when a
  // carried set it took found no room in the budget to be whole).
  bool ReadyForBackward(const Kept* kept, ChunkRows rows) const;

  const std::vector<T>& A() const { return A_; }  // (Di, N) = -exp(A_log)

 private:
  struct Acts;
  // with_z: also z, the gate half of in_proj (the forward summary's scan does not read it).
  void Recompute(const T* u, int64_t halo, int64_t M, Acts& acts, bool with_z = true) const;
  void ZHalf(Acts& acts) const;  // z, the gate half of in_proj, from acts.n
  // Takes what Forward carried (Carries must hold) for the rows of u: its carry count ends and
  // it is counted whole again, the arrays it gave up refilled with the same bits (now, or by
  // Backward), so that it holds all a backward pass reads but dL/do. by_summary: AdjointSummary
  // takes it (else Backward: KeptTakes' counts), and only Delta, which its scan reads, is
  // refilled now; n and x' wait for Backward (FinishRefill). False when the budget has no room
  // for the whole set: it serves the taking pass only.
  bool TakeCarried(const T* u, Kept& kept, bool by_summary) const;
  // The rest of TakeCarried's refill, for Backward: n and x'.
  void FinishRefill(const T* u, Kept& kept) const;
  KeptPtr MakeSet(ChunkRows rows, bool summary) const;  // MakeKept; summary: KeptTakes counts it
  int64_t CarriedSetBytes(ChunkRows rows) const;  // SetBytes' part that stays while carried

  using Spares = KeptSpares<T, 4>;  // Kept::SpareRoles

  const MambaConfig& cfg_;
  const LayerParams<T>& p_;
  // The block's store and its caches of sets and spares (null without a store), looked up once.
  KeptStore* kept_;
  KeptPool<Kept>* pool_ = nullptr;
  Spares* spares_ = nullptr;
  int64_t D_, Di_, N_, R_, W_;
  std::vector<T> A_;       // (Di, N)
  std::vector<T> conv_t_;  // (W, Di) conv weight transposed, so the conv loops run over Di
  // The products with fixed weights, packed once per block (kernels/cpu/gemm_packed.h): x W^T
  // through in_proj's x and z halves (Di, D) each, x_proj (R + 2N, Di), dt_proj (Di, R) and
  // out_proj (D, Di); the backward's dy W through W_in (2 Di, D), out_proj (dL/do = g W_out),
  // dt_proj and x_proj.
  Projection<T> in_x_, in_z_, x_proj_, dt_proj_, out_proj_;
  Projection<T> in_back_, out_back_, dt_back_, x_back_;
};

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_MAMBA_BLOCK_H_
