// The Mamba-2 span schedule (docs/MATH.md "Mamba-2"): a layer's tokens cut into the spans of a
// SpanPlan (runs of whole chunks, fixed by the step, never by the thread count), the spans run
// at once on a thread pool, and only small summaries cross them, combined in span order:
//   forward   each span's local end states from zero (H, P, N) and its decay product per head
//             Lambda_s (H); start(s + 1) = Lambda_s . start(s) + local(s); then every span
//             from its true start state.
//   backward  each span's states at its chunk starts from its start state; each span's local
//             adjoint carry from zero (Mamba2ChunkAdjoint), combined right to left:
//             carry(s) = local(s + 1) + Lambda_{s+1} . carry(s + 1); then every span from its
//             true carry into its own gradient partial, the conv halo of the span after it
//             applied to its last rows (Mamba2HaloBackward), the partials added in span order.
// The result is the same bits for any thread count; one span is the plain chunk-by-chunk pass.
#ifndef ADJSH_ENGINE_MAMBA2_SPANS_H_
#define ADJSH_ENGINE_MAMBA2_SPANS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/mamba2_layer.h"
#include "engine/span_plan.h"
#include "engine/stored_rows.h"
#include "engine/thread_pool.h"

namespace adjsh {

template <typename T>
class Mamba2SpanSchedule {
 public:
  Mamba2SpanSchedule(const Mamba2Config& cfg, const SpanPlan& plan, ThreadPool& pool);

  // Layer k's forward: out (T, D) gets u + the layer's addition, for the rows of every span
  // (out_rows: stored and committed, else the plain buffer top). Keeps layer k's span start
  // states and decays for its backward.
  void Forward(int64_t k, const Mamba2Layer<T>& l, const StoredRows<T>& u,
               StoredRows<T>* out_rows, T* top);
  // Layer k's backward after its forward: dout (T, D) = dL/du^{k+1}; din (T, D) gets dL/du^k;
  // the layer's gradient is added into g.
  void Backward(int64_t k, const Mamba2Layer<T>& l, const StoredRows<T>& u, const T* dout,
                T* din, Mamba2Layer<T>& g);

  // Numbers kept across the step (start states and decays) and per chunk (the backward's
  // chunk-start states).
  int64_t kept_values() const;

 private:
  struct Scratch {
    Mamba2ChunkActs<T> acts;
    std::vector<T> rows, in, out, S, lambda;
  };
  std::unique_ptr<Scratch> TakeScratch();
  void GiveScratch(std::unique_ptr<Scratch> s);
  // Runs span s's chunks forward from S (left as the span's end state); with out rows, writes
  // them; lambda (H), if non-null, gets the span's decay product per head.
  void SpanForward(const Mamba2Layer<T>& l, const StoredRows<T>& u, int64_t s, T* S,
                   StoredRows<T>* out_rows, T* top, T* lambda, Scratch& sc);

  const Mamba2Config cfg_;
  const Mamba2Dims d_;
  const SpanPlan& plan_;
  ThreadPool& pool_;
  const int64_t S_, HPN_;
  std::vector<T> start_;     // (K, S, H P N): each layer's span start states
  std::vector<T> lambda_;    // (K, S, H): each layer's span decay products
  std::vector<T> chunk_states_;  // (chunks, H P N): the backward's, one layer at a time
  std::mutex mu_;
  std::vector<std::unique_ptr<Scratch>> free_;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MAMBA2_SPANS_H_
