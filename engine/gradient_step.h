// The state of one gradient computation by the in-process chunk schedules (adjoint_engine.h:
// wavefront and two-pass, and the layered backward of a truncated window or the top-of-stack
// cotangent). Run() does everything; the wavefront's exact backward goes through the pieces
//   ForwardAndHead();                      // loss, layer inputs, chunk states, dL/du^{K+1}
//   for each task, once its dependencies are applied (BackwardDependencies):
//     GatherInputs(task, in) -> RunBackwardTask(block, config, in, out) -> ApplyResult(task, out)
//   Finish();                              // embedding gradient; the result
// (workers run the span schedule instead: engine/span_plan.h). Every kernel call goes through
// options.device's backend (checked by CheckDevice<T> first).
#ifndef ADJSH_ENGINE_GRADIENT_STEP_H_
#define ADJSH_ENGINE_GRADIENT_STEP_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/model.h"
#include "engine/adjoint_engine.h"
#include "engine/backward_task.h"
#include "engine/stored_rows.h"
#include "engine/thread_pool.h"
#include "kernels/backend.h"

namespace adjsh {

template <typename T>
class GradientStep {
 public:
  // params and tokens must outlive the step; tokens are checked by ComputeGradient's caller.
  GradientStep(const ModelParams<T>& params, std::span<const uint32_t> tokens,
               const GradOptions& options);

  GradResult<T> Run();

  // The distributable exact backward (wavefront schedule). Task ids run from 0 to
  // num_backward_tasks() - 1; task (k, c) has id (K - 1 - k) * chunks + (chunks - 1 - c).
  double ForwardAndHead();
  int64_t num_backward_tasks() const { return K_ * nC_; }
  int64_t num_chunks() const { return nC_; }
  std::pair<int64_t, int64_t> TaskLayerChunk(int64_t task) const;  // (k, c)
  std::vector<int64_t> BackwardDependencies(int64_t task) const;   // (k + 1, c), (k, c + 1)
  std::vector<int64_t> BackwardSuccessors(int64_t task) const;     // (k - 1, c), (k, c - 1)
  void GatherInputs(int64_t task, BackwardTaskInputs<T>& in) const;
  void ApplyResult(int64_t task, const BackwardTaskOutputs<T>& out);
  GradResult<T> Finish();

  struct ChunkSpan {
    int64_t t0, len, halo;  // tokens [t0, t0 + len), with halo conv rows before
  };
  ChunkSpan TaskSpan(int64_t task) const { return Span(TaskLayerChunk(task).second); }

 private:
  ChunkSpan Span(int64_t c) const;
  void Progress(std::string_view phase, int64_t done, int64_t total) const;
  // Rows [first, first + n) of u^k (k < K), through scratch when stored as bf16.
  const T* InputRows(int64_t k, int64_t first, int64_t n, std::vector<T>& scratch) const {
    return layer_in_[k].Read(first * D_, n * D_, scratch);
  }

  void Prepare();
  void ForwardWavefront();
  void ForwardTwoPass();
  double Head();
  void BackwardWavefront();
  void BackwardLayered();
  void EmbeddingGrad(const T* du1);

  const ModelParams<T>& p_;
  const MambaConfig& cfg_;
  std::span<const uint32_t> tokens_;
  const GradOptions& opt_;
  std::unique_ptr<ThreadPool> pool_;
  const int64_t T_, C_, nC_, D_, K_, DiN_, max_ahead_;
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
  GradResult<T> result_;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_GRADIENT_STEP_H_
