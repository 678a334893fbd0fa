// The state of one gradient computation by the in-process chunk schedules (adjoint_engine.h:
// wavefront and two-pass, and the layered backward of a truncated window or the top-of-stack
// cotangent). Run() does everything. The wavefront's exact gradient is one task graph
// (RunWavefront): forward (k, c), the head's rows of chunk c, backward (k, c); each chunk's
// forward carries its activations to its backward task as the kept budget allows
// (kernels/cpu/kept_pool.h), which then skips its recompute with the same bits. Workers run
// the span schedule instead (engine/span_plan.h). Every kernel call goes through
// options.device's backend (checked by CheckDevice<T> first).
#ifndef ADJSH_ENGINE_GRADIENT_STEP_H_
#define ADJSH_ENGINE_GRADIENT_STEP_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/model.h"
#include "engine/grad_options.h"
#include "engine/grad_result.h"
#include "engine/stored_rows.h"
#include "common/thread_pool.h"
#include "kernels/backend.h"

namespace adjsh {

template <typename T>
class GradientStep {
 public:
  // params and tokens must outlive the step; tokens are checked by ComputeGradient's caller.
  GradientStep(const ModelParams<T>& params, std::span<const uint32_t> tokens,
               const GradOptions& options);

  GradResult<T> Run();

  // The chunks' first rows, then `rows` (chunks + 1 values): every C rows; tapered (the
  // wavefront's one graph), with C a multiple of 256 and rows >= 2 C, the first chunk is C / 4
  // rows and the last starts at the last multiple of 64 at least C / 4 rows before the end.
  static std::vector<int64_t> ChunkStarts(int64_t rows, int64_t C, bool tapered);

 private:
  struct ChunkSpan {
    int64_t t0, len, halo;  // tokens [t0, t0 + len), with halo conv rows before
  };
  // The wavefront's backward tasks: task (k, c) has id (K - 1 - k) * chunks + (chunks - 1 - c).
  std::pair<int64_t, int64_t> TaskLayerChunk(int64_t task) const;  // (k, c)
  std::vector<int64_t> BackwardSuccessors(int64_t task) const;     // (k - 1, c), (k, c - 1)
  GradResult<T> Finish();

  ChunkSpan Span(int64_t c) const;
  void Progress(std::string_view phase, int64_t done, int64_t total) const;
  // Rows [first, first + n) of u^k (k < K), through scratch when stored as bf16.
  const T* InputRows(int64_t k, int64_t first, int64_t n, std::vector<T>& scratch) const {
    return layer_in_[k].Read(first * D_, n * D_, scratch);
  }

  void Prepare(bool embed);
  void EmbedRows(int64_t t0, int64_t n);  // u^1 of rows [t0, t0 + n)
  // Forward task (k, c): u^{k+1} of the chunk's rows and the state after it. carry (the
  // wavefront's graph): keep what the backward task (k, c) would recompute (carried_), as the
  // kept budget allows, and on layer 1 embed the chunk's rows first.
  void ForwardTask(int64_t k, int64_t c, bool carry);
  void ForwardWavefront();
  void ForwardTwoPass();
  void HeadTargets();  // targets_, the count of targets; the head's counts restarted
  // The head over rows [t0, t0 + n): returns their loss sum; dL/du^{K+1} into du (n, D); the
  // head matrix's and dw_f's partials added into the gradient (callers go in row order).
  double HeadRows(int64_t t0, int64_t n, T* du);
  double Head();  // the whole head at once: the mean loss, dL/du^{K+1} into top_
  double MeanLoss(double sum);  // sum over the counted targets; result_'s counts set
  void RunWavefront();
  // Backward task (k, c), once (k + 1, c) and (k, c + 1) have run: dL/du^k of the chunk's rows
  // replaces dL/du^{k+1} there in top_, with the halo rows of later chunks added; mu and the
  // halo kept for (k, c - 1); the partial added to layer k's gradient.
  void BackwardTask(int64_t task);
  void BackwardLayered();
  void EmbeddingGrad(const T* du1);

  const ModelParams<T>& p_;
  const MambaConfig& cfg_;
  std::span<const uint32_t> tokens_;
  const GradOptions& opt_;
  std::unique_ptr<ThreadPool> pool_;
  const int64_t T_, C_;
  const std::vector<int64_t> starts_;  // ChunkStarts
  const int64_t nC_, D_, K_, DiN_, max_ahead_;
  // The device's backend (options.device; the CPU is one too) and the layers' blocks there:
  // every kernel call goes through them. A_: the decays for the combines.
  std::unique_ptr<Backend<T>> backend_;
  std::vector<std::unique_ptr<BlockBackend<T>>> blocks_;
  std::vector<T> A_;  // K x (Di, N)
  std::vector<StoredRows<T>> layer_in_;   // K x (T, D): u^k
  std::vector<StoredRows<T>> states_;     // K x (chunks, Di, N): h before each chunk
  // (T, D): u^{K+1}, then dL/du^{K+1}; the wavefront backward replaces chunk c's dL/du^{k+1}
  // with dL/du^k as task (k, c) is applied, ending with dL/du^1.
  std::vector<T> top_;
  std::vector<std::vector<T>> mu_;        // per (k, c): the adjoint into chunk c, until consumed
  std::vector<std::vector<T>> halos_;     // per task: dL/du for the W - 1 rows before its chunk
  // The wavefront's backward adds the chunks of up to this many C rows into a layer's gradient
  // at once (BackwardTask); partials_: per layer, the group's sum when there are more.
  static constexpr int64_t kChunksPerPartial = 16;
  int64_t Group(int64_t c) const { return starts_[c] / (kChunksPerPartial * C_); }
  std::vector<LayerParams<T>> partials_;
  // per (k, c): what forward task (k, c) carried for backward task (k, c); null: recompute.
  std::vector<std::unique_ptr<KeptActs>> carried_;
  std::vector<int64_t> targets_;  // per row t: the target token t + 1, -1 when not counted
  int64_t n_targets_ = 0, correct_ = 0;
  GradResult<T> result_;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_GRADIENT_STEP_H_
