// The span schedule of one gradient step (docs/ARCHITECTURE.md "Spans"): the T tokens are cut
// into S spans, each a run of whole chunks; S is fixed by the job, never by the number of
// workers, so the arithmetic, and the result, is the same for any number of them. Per layer the
// step runs four kinds of (layer, span) tasks:
//
//   kForwardSummary   (k, s), s < S-1: the span's scan of layer k from a zero state: the delta
//                     sums Sigma (Di) and the end state h~ (Di, N). The coordinator combines
//                     h0(k, s+1) = exp(A Sigma_s) . h0(k, s) + h~_s in span order.
//   kForward          (k, s): the span's layer k from its true start state h0(k, s); keeps u^{k+1}
//                     (k = K-1: and then runs the LM head of its rows); returns the last W - 1
//                     rows of u^{k+1}, the conv halo of span s + 1 at layer k + 1.
//   kBackwardSummary  (k, s), s > 0: the span's reverse adjoint scan from zero: m_s (Di, N). The
//                     coordinator combines mu(k, s-1) = m_s + exp(A Sigma_s) . mu(k, s) in
//                     reverse span order (mu(k, S-1) = 0).
//   kBackward         (k, s): the span's VJPs with mu(k, s) coming in: layer k's partial, dL/du^k
//                     (kept), and the conv-halo gradient of span s - 1's last rows.
//
// Task ids are the order tasks are preferred in (lowest ready id first): layer by layer, the
// forward's summaries, then its spans; then the backward from the top layer down.
#ifndef ADJSH_ENGINE_SPAN_PLAN_H_
#define ADJSH_ENGINE_SPAN_PLAN_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace adjsh {

enum class SpanPhase { kForwardSummary, kForward, kBackwardSummary, kBackward };
std::string_view SpanPhaseName(SpanPhase phase);  // "fwd_summary", "fwd", "bwd_summary", "bwd"

struct SpanTask {
  SpanPhase phase = SpanPhase::kForward;
  int64_t layer = 0, span = 0;
};

struct SpanRange {
  int64_t c0 = 0, c1 = 0;   // chunks [c0, c1)
  int64_t t0 = 0, len = 0;  // tokens [t0, t0 + len)
  int64_t halo = 0;         // conv rows before t0 that its first chunk reads: min(W - 1, t0)
};

class SpanPlan {
 public:
  // The plan for T tokens, chunk C (clamped to T), S spans (0: DefaultSpans) and a model of
  // K layers with conv kernel W. INVALID_ARGUMENT when S is more than the chunks, or when a
  // span after the first is shorter than W - 1 tokens (its conv halo would reach past the
  // previous span).
  // forward_only: the forward's tasks alone (kForwardSummary, kForward), for a step that
  // wants the loss only (GradOptions::forward_only: evaluation through the workers); its tasks
  // have the ids they have in the full plan.
  static absl::StatusOr<SpanPlan> Make(int64_t T, int64_t chunk, int64_t spans, int64_t K,
                                       int64_t W, bool forward_only = false);

  // Make's checks of S spans alone (without building the plan: a job spec's check at submit):
  // OK, or Make's INVALID_ARGUMENT. T, chunk and W are at least 1; spans 0 is always OK.
  static absl::Status CheckSpans(int64_t T, int64_t chunk, int64_t spans, int64_t W);

  // About one span per 16384 tokens, at least 8, at most one per chunk, and no more than keep
  // every span after the first at W - 1 tokens or longer.
  static int64_t DefaultSpans(int64_t T, int64_t chunk, int64_t W);

  int64_t T() const { return T_; }
  int64_t chunk() const { return C_; }
  int64_t chunks() const { return nC_; }
  int64_t spans() const { return static_cast<int64_t>(ranges_.size()); }
  int64_t layers() const { return K_; }
  bool forward_only() const { return forward_only_; }
  const SpanRange& range(int64_t s) const { return ranges_[s]; }
  // Chunk c's tokens [t0, t0 + len) and conv halo.
  SpanRange Chunk(int64_t c) const;

  // Every task of the step, by id.
  int64_t num_tasks() const { return static_cast<int64_t>(tasks_.size()); }
  const SpanTask& task(int64_t id) const { return tasks_[id]; }
  int64_t Id(SpanPhase phase, int64_t layer, int64_t span) const;  // -1: no such task
  // The tasks whose results this one reads (each listed once, all with lower ids).
  const std::vector<int64_t>& Dependencies(int64_t id) const { return deps_[id]; }
  const std::vector<int64_t>& Successors(int64_t id) const { return succ_[id]; }
  // The tasks that rebuild task id's span from nothing, in order, before it runs: the forward
  // of the layers below it (forward tasks), or the whole forward and the backward of the layers
  // above it (backward tasks).
  std::vector<int64_t> ReplayIds(int64_t id) const;

 private:
  void Build();
  int64_t T_ = 0, C_ = 0, nC_ = 0, K_ = 0, W_ = 0;
  bool forward_only_ = false;
  std::vector<SpanRange> ranges_;
  std::vector<SpanTask> tasks_;
  std::vector<int64_t> index_;  // (phase, layer, span) -> id or -1
  std::vector<std::vector<int64_t>> deps_, succ_;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPAN_PLAN_H_
