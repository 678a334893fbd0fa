// The coordinator's side of a span-scheduled step (docs/ARCHITECTURE.md "Spans"): what crosses
// spans, and the reduction. It holds, per (layer, span), only (Di, N)-sized summaries and W - 1
// halo rows, never anything per token:
//   forward   h0(k, 0) = 0, h0(k, s+1) = exp(A Sigma_s) . h0(k, s) + h~_s, in span order;
//             the last W - 1 rows of u^{k+1} of span s, for span s + 1 at layer k + 1;
//   backward  mu(k, S-1) = 0, mu(k, S-2) = m_{S-1}, mu(k, s-1) = m_s + exp(A Sigma_s) . mu(k, s);
//             span s's part of dL/du^k of span s - 1's last rows;
//   partials  summed in a fixed binary tree over span indices (left + right), node by node as
//             both children arrive, so the sum is the same whoever sent which span and when.
// The in-process engine and the coordinator's TaskService both drive a step through it, so both
// add the same numbers in the same order. Not thread-safe: callers serialise.
#ifndef ADJSH_ENGINE_SPAN_LEDGER_H_
#define ADJSH_ENGINE_SPAN_LEDGER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/model.h"
#include "engine/grad_options.h"
#include "engine/grad_result.h"
#include "engine/reduce_groups.h"
#include "engine/families/families.h"
#include "engine/span_plan.h"
#include "engine/span_tree.h"
#include "engine/span_work.h"

namespace adjsh {

// Sums leaves 0..n-1 in the SpanTree over n (engine/span_tree.h); a node is added
// (left += right) as soon as both children are in, and its children freed.
template <typename V>
class FixedTreeSum {
 public:
  using AddFn = std::function<void(V& left, const V& right)>;
  FixedTreeSum(int64_t n, AddFn add);
  void Add(int64_t leaf, V value);  // each leaf once
  // The whole sum, computed elsewhere in the same tree (the worker tree): instead of leaves.
  void SetRoot(V value);
  bool Complete() const { return root_.has_value(); }
  V TakeRoot() { return std::move(*root_); }
  int64_t held() const;  // nodes waiting for a sibling

 private:
  SpanTree tree_;
  std::vector<std::optional<V>> value_;  // per node
  AddFn add_;
  std::optional<V> root_;
};

// P: the model type's parameter struct (ModelParams, Mamba2Params: engine/families/family.h).
template <typename T, template <typename> class P = ModelParams>
class SpanLedger {
 public:
  using Layer = typename FamilyOfParams<P>::template Layer<T>;
  using Outputs = SpanOutputs<T, Layer>;
  // tokens and mask (empty or one per token) must outlive the ledger.
  SpanLedger(const P<T>& params, const SpanPlan& plan, std::span<const uint32_t> tokens,
             std::span<const uint8_t> mask);

  int64_t n_targets() const { return n_targets_; }
  // The ids [t0 - H, min(T, t0 + len + 1)) of span s (and the mask there, empty without one):
  // what its owner starts from (SpanWork).
  std::vector<uint32_t> SpanTokens(int64_t s) const;
  std::vector<uint8_t> SpanMask(int64_t s) const;

  // The inputs of a task whose dependencies have all been applied.
  SpanInputs<T> Inputs(int64_t id) const;
  // What rebuilds span s from nothing, up to (not including) task `id`: the forward of every
  // layer below it (forward tasks), or the whole forward and the backward of the layers above it
  // (backward tasks), with the inputs those tasks had. Their outputs were applied already.
  std::vector<std::pair<SpanTask, SpanInputs<T>>> Replay(int64_t id) const;
  // Applies an accepted result, once per task. With ReduceElsewhere, its partials are not
  // read (the worker tree sums them; their roots come through SetReduced).
  void Apply(int64_t id, Outputs&& out);
  // The partials are summed in the same tree elsewhere (the workers'): call before any Apply.
  void ReduceElsewhere() { elsewhere_ = true; }
  bool reduced_elsewhere() const { return elsewhere_; }
  // The root of group g (engine/reduce_groups.h), reduced elsewhere. FAILED_PRECONDITION when
  // it was given already.
  absl::Status SetReduced(int32_t group, GroupValue<T>&& value);
  // A tied model's head and lookup roots added elsewhere (head + lookup, element by element, as
  // Finish adds them): both groups at once, so that their sum crosses once
  // (engine/device_sums.h). FAILED_PRECONDITION when untied or either was given already.
  absl::Status SetReducedTiedEmbed(std::vector<T>&& head_plus_lookup);
  bool Reduced(int32_t group) const;
  bool AllReduced() const;
  // After every task: the loss, the gradient (none for a forward-only plan), the counts.
  GradResult<T, P> Finish();
  // Bytes held now (summaries, halos, partials waiting in the trees).
  int64_t held_bytes() const;

 private:
  void FinishLoss(GradResult<T, P>& r) const;  // the loss, targets and correct of r
  void ExtendH0(int64_t k);
  void ExtendMu(int64_t k);

  const P<T>& p_;
  const SpanPlan& plan_;
  std::span<const uint32_t> tokens_;
  std::span<const uint8_t> mask_;
  const int64_t S_, K_, D_, DiN_;
  int64_t n_targets_ = 0;
  std::vector<T> A_;  // K x (Di, N)
  // Per (k, s), index k * S + s.
  std::vector<std::vector<T>> sigma_, h_end_, h0_, halo_next_, m_, mu_, du_halo_prev_;
  std::vector<int64_t> h0_ready_, mu_ready_;  // per layer: h0 known for s < h0_ready_[k]; mu
                                              // for s >= mu_ready_[k]
  std::vector<double> loss_;
  std::vector<int64_t> correct_;
  bool elsewhere_ = false;
  std::vector<FixedTreeSum<Layer>> layer_sums_;
  FixedTreeSum<std::vector<T>> head_embed_sum_, lookup_embed_sum_, norm_f_sum_;
  bool tied_summed_ = false;  // head_embed_sum_ holds head + lookup (SetReducedTiedEmbed)
};

// The ledger of a parameter struct (ModelParams<T>, Mamba2Params<T>), for code that holds the
// struct's type rather than its template.
template <typename Params>
struct LedgerFor;
template <typename T, template <typename> class P>
struct LedgerFor<P<T>> {
  using type = SpanLedger<T, P>;
};
template <typename Params>
using LedgerOf = typename LedgerFor<Params>::type;

}  // namespace adjsh

#endif  // ADJSH_ENGINE_SPAN_LEDGER_H_
