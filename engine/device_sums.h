// The parameter partials of a resident step (a model whose spans keep their rows on a device:
// kernels/row_space.h) summed where they are, in the ledger's own tree (FixedTreeSum over the
// span tree, left + right at every node), each group's root brought to the host once and given
// to the ledger (SpanLedger::SetReduced): a step moves one gradient down, not one per span.
// Each node is one f32 (or f64) add per element, as the ledger's host sum takes it, so the
// gradient has the same bits as if every partial had come down.
//
//   DeviceSums<T, P, Model> sums(model, plan, ledger);   // ledger.ReduceElsewhere() is called
//   sums.Take(task, out);  // after Run(task, in, out, Partials::kDevice), under the
//                          // lock that guards the ledger
#ifndef ADJSH_ENGINE_DEVICE_SUMS_H_
#define ADJSH_ENGINE_DEVICE_SUMS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "engine/reduce_groups.h"
#include "engine/span_ledger.h"
#include "engine/span_plan.h"
#include "kernels/row_space.h"

namespace adjsh {

template <typename T, template <typename> class P, typename Model>
class DeviceSums {
 public:
  using Outputs = typename SpanLedger<T, P>::Outputs;

  DeviceSums(const Model& model, const SpanPlan& plan, SpanLedger<T, P>& ledger)
      : model_(model),
        space_(*model.rows),
        ledger_(ledger),
        K_(plan.layers()),
        tied_(model.params->config.tie_word_embeddings) {
    const int64_t S = plan.spans();
    auto add = [this](RowBuffer<T>& a, const RowBuffer<T>& b) {
      space_.Add(a.data(), b.data(), a.size());
    };
    for (int64_t k = 0; k < K_; ++k) layers_.emplace_back(S, add);
    head_.emplace_back(S, add);
    lookup_.emplace_back(S, add);
    norm_f_.emplace_back(S, [](std::vector<T>& a, const std::vector<T>& b) {
      for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    });
    ledger_.ReduceElsewhere();
  }

  // The task's partials (out.embed_sum, out.grad_sum on the device; out.norm_f on the host)
  // into their trees; a completed root goes to the ledger.
  void Take(const SpanTask& task, Outputs& out) {
    const int64_t s = task.span;
    if (task.phase == SpanPhase::kForward && task.layer + 1 == K_ && out.embed_sum.size() > 0) {
      head_[0].Add(s, std::move(out.embed_sum));
      norm_f_[0].Add(s, std::move(out.norm_f));
      if (head_[0].Complete() && !tied_) Give(HeadGroup(K_), Down(head_[0].TakeRoot()));
      if (norm_f_[0].Complete()) Give(NormFGroup(K_), norm_f_[0].TakeRoot());
    } else if (task.phase == SpanPhase::kBackward) {
      FixedTreeSum<RowBuffer<T>>& layer = layers_[task.layer];
      layer.Add(s, std::move(out.grad_sum));
      if (layer.Complete()) GiveLayer(task.layer, layer.TakeRoot());
      if (task.layer > 0) return;
      lookup_[0].Add(s, std::move(out.embed_sum));
      if (!lookup_[0].Complete()) return;
      if (!tied_) return Give(LookupGroup(K_), Down(lookup_[0].TakeRoot()));
      // Tied: the head's root (complete since the forward) plus the lookups', as the ledger's
      // Finish adds them, down once.
      ADJSH_CHECK(head_[0].Complete(), "the lookups' root before the head's");
      RowBuffer<T> embed = head_[0].TakeRoot();
      const RowBuffer<T> lookup = lookup_[0].TakeRoot();
      space_.Add(embed.data(), lookup.data(), embed.size());
      const absl::Status st = ledger_.SetReducedTiedEmbed(Down(std::move(embed)));
      ADJSH_CHECK(st.ok(), std::string(st.message()).c_str());
    }
  }

 private:
  std::vector<T> Down(RowBuffer<T> root) {
    std::vector<T> v(root.size());
    space_.Download(v.data(), root.data(), root.size());
    space_.Finish();
    return v;
  }
  void Give(int32_t group, std::vector<T> value) {
    GroupValue<T> g;
    g.push_back(std::move(value));
    const absl::Status st = ledger_.SetReduced(group, std::move(g));
    ADJSH_CHECK(st.ok(), std::string(st.message()).c_str());
  }
  // A layer's root into the ledger's group form (its tensors in slot order: TakeLeaves).
  void GiveLayer(int64_t k, RowBuffer<T> root) {
    Outputs o;
    model_.layers[k]->DownloadGrad(root.data(), o.grad);
    space_.Finish();
    std::vector<GroupLeaf<T>> leaves = TakeLeaves({SpanPhase::kBackward, k, 0}, K_, o);
    const absl::Status st = ledger_.SetReduced(leaves.at(0).group, std::move(leaves[0].value));
    ADJSH_CHECK(st.ok(), std::string(st.message()).c_str());
  }

  const Model& model_;
  RowSpace<T>& space_;
  SpanLedger<T, P>& ledger_;
  const int64_t K_;
  const bool tied_;  // the head's and the lookups' roots come down as one (V, D) sum
  // One tree per group, each made with its add (the layers' in a vector; the others in vectors
  // of one for the same reason).
  std::vector<FixedTreeSum<RowBuffer<T>>> layers_, head_, lookup_;
  std::vector<FixedTreeSum<std::vector<T>>> norm_f_;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_DEVICE_SUMS_H_
