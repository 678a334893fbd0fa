#include "engine/span_ledger.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kernels/decay.h"

namespace adjsh {

// ---------------------------------------------------------------------------------------------
// FixedTreeSum

template <typename V>
FixedTreeSum<V>::FixedTreeSum(int64_t n, AddFn add)
    : tree_(n), value_(tree_.size()), add_(std::move(add)) {}

template <typename V>
void FixedTreeSum<V>::Add(int64_t leaf, V value) {
  int64_t id = tree_.leaf(leaf);
  ADJSH_CHECK(!value_[id].has_value() && !root_, "a tree leaf added twice");
  value_[id] = std::move(value);
  for (;;) {
    const int64_t parent = tree_.node(id).parent;
    if (parent < 0) {
      root_ = std::move(value_[id]);
      value_[id].reset();
      return;
    }
    const int64_t left = tree_.node(parent).left, right = tree_.node(parent).right;
    if (!value_[left] || !value_[right]) return;
    V sum = std::move(*value_[left]);
    add_(sum, *value_[right]);  // left + right, in that order
    value_[left].reset();
    value_[right].reset();
    value_[parent] = std::move(sum);
    id = parent;
  }
}

template <typename V>
void FixedTreeSum<V>::SetRoot(V value) {
  ADJSH_CHECK(!root_ && held() == 0, "a tree sum given its root after leaves or twice");
  root_ = std::move(value);
}

template <typename V>
int64_t FixedTreeSum<V>::held() const {
  int64_t n = 0;
  for (const std::optional<V>& v : value_) n += v.has_value() ? 1 : 0;
  return n;
}

namespace {

template <typename T>
void AddVector(std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
}

template <typename T>
int64_t Bytes(const std::vector<std::vector<T>>& vs) {
  int64_t n = 0;
  for (const auto& v : vs) n += static_cast<int64_t>(v.size() * sizeof(T));
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SpanLedger

template <typename T, template <typename> class P>
SpanLedger<T, P>::SpanLedger(const P<T>& params, const SpanPlan& plan,
                          std::span<const uint32_t> tokens, std::span<const uint8_t> mask)
    : p_(params),
      plan_(plan),
      tokens_(tokens),
      mask_(mask),
      S_(plan.spans()),
      K_(plan.layers()),
      D_(params.config.hidden_size),
      DiN_(FamilyOfParams<P>::StateSize(params.config)),
      loss_(S_, 0.0),
      correct_(S_, 0),
      head_embed_sum_(S_, AddVector<T>),
      lookup_embed_sum_(S_, AddVector<T>),
      norm_f_sum_(S_, AddVector<T>) {
  const int64_t T_ = static_cast<int64_t>(tokens.size());
  n_targets_ = T_ - 1;
  if (!mask.empty()) n_targets_ = std::count_if(mask.begin() + 1, mask.end(), [](uint8_t m) {
                       return m != 0;
                     });
  A_ = FamilyOfParams<P>::template Rates<T>(params);
  for (auto* v : {&sigma_, &h_end_, &h0_, &halo_next_, &m_, &mu_, &du_halo_prev_})
    v->assign(K_ * S_, {});
  h0_ready_.assign(K_, 1);  // h0(k, 0) = 0
  mu_ready_.assign(K_, S_ - 1);  // mu(k, S - 1) = 0
  for (int64_t k = 0; k < K_; ++k) {
    h0_[k * S_].assign(DiN_, T(0));
    mu_[k * S_ + S_ - 1].clear();  // empty = zero
    layer_sums_.emplace_back(S_, [](Layer& a, const Layer& b) { FamilyOfParams<P>::Add(a, b); });
  }
}

template <typename T, template <typename> class P>
std::vector<uint32_t> SpanLedger<T, P>::SpanTokens(int64_t s) const {
  const SpanRange& r = plan_.range(s);
  const int64_t end = std::min<int64_t>(plan_.T(), r.t0 + r.len + 1);
  return std::vector<uint32_t>(tokens_.begin() + (r.t0 - r.halo), tokens_.begin() + end);
}

template <typename T, template <typename> class P>
std::vector<uint8_t> SpanLedger<T, P>::SpanMask(int64_t s) const {
  if (mask_.empty()) return {};
  const SpanRange& r = plan_.range(s);
  const int64_t end = std::min<int64_t>(plan_.T(), r.t0 + r.len + 1);
  return std::vector<uint8_t>(mask_.begin() + (r.t0 - r.halo), mask_.begin() + end);
}

template <typename T, template <typename> class P>
SpanInputs<T> SpanLedger<T, P>::Inputs(int64_t id) const {
  const auto [phase, k, s] = plan_.task(id);
  SpanInputs<T> in;
  const bool forward = phase == SpanPhase::kForwardSummary || phase == SpanPhase::kForward;
  if (forward) {
    if (k > 0 && s > 0) in.halo_u = halo_next_[(k - 1) * S_ + s - 1];
    if (phase == SpanPhase::kForward && s > 0) in.h0 = h0_[k * S_ + s];
  } else {
    if (k + 1 < K_ && s + 1 < S_) in.du_halo = du_halo_prev_[(k + 1) * S_ + s + 1];
    if (phase == SpanPhase::kBackward) in.mu = mu_[k * S_ + s];
  }
  return in;
}

template <typename T, template <typename> class P>
std::vector<std::pair<SpanTask, SpanInputs<T>>> SpanLedger<T, P>::Replay(int64_t id) const {
  std::vector<std::pair<SpanTask, SpanInputs<T>>> steps;
  for (int64_t r : plan_.ReplayIds(id)) steps.push_back({plan_.task(r), Inputs(r)});
  return steps;
}

template <typename T, template <typename> class P>
void SpanLedger<T, P>::ExtendH0(int64_t k) {
  const int64_t N = p_.config.state_size;
  int64_t& s = h0_ready_[k];  // h0(k, s) = P_{s-1} . h0(k, s-1) + h~_{s-1}
  while (s < S_ && !h_end_[k * S_ + s - 1].empty()) {
    const std::vector<T>& prev = h0_[k * S_ + s - 1];
    const std::vector<T>& sig = sigma_[k * S_ + s - 1];
    const std::vector<T>& add = h_end_[k * S_ + s - 1];
    std::vector<T>& out = h0_[k * S_ + s];
    out.resize(DiN_);
    DecayAdd(A_.data() + k * DiN_, sig.data(), prev.data(), add.data(), DiN_, N, out.data());
    ++s;
  }
}

template <typename T, template <typename> class P>
void SpanLedger<T, P>::ExtendMu(int64_t k) {
  const int64_t N = p_.config.state_size;
  int64_t& s = mu_ready_[k];  // mu(k, s-1) = m_s + P_s . mu(k, s), known for s' >= s
  while (s > 0 && !m_[k * S_ + s].empty()) {
    std::vector<T>& out = mu_[k * S_ + s - 1];
    const std::vector<T>& m = m_[k * S_ + s];
    if (s == S_ - 1) {
      out = m;  // nothing flows into the last span
    } else {
      const std::vector<T>& in = mu_[k * S_ + s];
      const std::vector<T>& sig = sigma_[k * S_ + s];
      out.resize(DiN_);  // P_s . mu + m_s (a sum of two terms: the order is exact)
      DecayAdd(A_.data() + k * DiN_, sig.data(), in.data(), m.data(), DiN_, N, out.data());
    }
    --s;
  }
}

template <typename T, template <typename> class P>
void SpanLedger<T, P>::Apply(int64_t id, Outputs&& out) {
  const auto [phase, k, s] = plan_.task(id);
  const int64_t i = k * S_ + s;
  switch (phase) {
    case SpanPhase::kForwardSummary:
      sigma_[i] = std::move(out.sigma);
      h_end_[i] = std::move(out.h_end);
      ExtendH0(k);
      break;
    case SpanPhase::kForward:
      if (k + 1 < K_) {
        halo_next_[i] = std::move(out.halo_next);
      } else {
        loss_[s] = out.loss_sum;
        correct_[s] = out.correct;
        if (elsewhere_ || plan_.forward_only()) break;
        head_embed_sum_.Add(s, std::move(out.embed));
        norm_f_sum_.Add(s, std::move(out.norm_f));
      }
      break;
    case SpanPhase::kBackwardSummary:
      m_[i] = std::move(out.m);
      ExtendMu(k);
      break;
    case SpanPhase::kBackward:
      du_halo_prev_[i] = std::move(out.du_halo_prev);
      if (elsewhere_) break;
      layer_sums_[k].Add(s, std::move(out.grad));
      if (k == 0) lookup_embed_sum_.Add(s, std::move(out.embed));
      break;
  }
}

template <typename T, template <typename> class P>
absl::Status SpanLedger<T, P>::SetReduced(int32_t group, GroupValue<T>&& value) {
  if (group < 0 || group >= NumGroups(K_)) {
    return absl::InvalidArgumentError(absl::StrCat("no reduction group ", group));
  }
  if (Reduced(group)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", GroupName(group, K_), " group is reduced already"));
  }
  if (group < K_) {
    layer_sums_[group].SetRoot(FamilyOfParams<P>::FromGroup(std::move(value)));
  } else {
    FixedTreeSum<std::vector<T>>& sum = group == HeadGroup(K_)     ? head_embed_sum_
                                        : group == LookupGroup(K_) ? lookup_embed_sum_
                                                                   : norm_f_sum_;
    sum.SetRoot(std::move(value.at(0)));
  }
  return absl::OkStatus();
}

template <typename T, template <typename> class P>
absl::Status SpanLedger<T, P>::SetReducedTiedEmbed(std::vector<T>&& head_plus_lookup) {
  if (!p_.config.tie_word_embeddings) {
    return absl::FailedPreconditionError("an untied model's head and lookup sum apart");
  }
  if (Reduced(HeadGroup(K_)) || Reduced(LookupGroup(K_))) {
    return absl::FailedPreconditionError("the head or lookup group is reduced already");
  }
  head_embed_sum_.SetRoot(std::move(head_plus_lookup));
  lookup_embed_sum_.SetRoot({});
  tied_summed_ = true;
  return absl::OkStatus();
}

template <typename T, template <typename> class P>
bool SpanLedger<T, P>::Reduced(int32_t group) const {
  if (group < K_) return layer_sums_[group].Complete();
  if (group == HeadGroup(K_)) return head_embed_sum_.Complete();
  if (group == LookupGroup(K_)) return lookup_embed_sum_.Complete();
  return norm_f_sum_.Complete();
}

template <typename T, template <typename> class P>
bool SpanLedger<T, P>::AllReduced() const {
  for (int32_t g = 0; g < NumGroups(K_); ++g)
    if (!Reduced(g)) return false;
  return true;
}

template <typename T, template <typename> class P>
GradResult<T, P> SpanLedger<T, P>::Finish() {
  GradResult<T, P> r;
  r.grad.config = p_.config;
  if (plan_.forward_only()) {  // the loss alone: no partial was sent
    FinishLoss(r);
    return r;
  }
  for (int64_t k = 0; k < K_; ++k) {
    ADJSH_CHECK(layer_sums_[k].Complete(), "Finish before every partial arrived");
    r.grad.layers.push_back(layer_sums_[k].TakeRoot());
  }
  if (p_.config.tie_word_embeddings) {
    r.grad.embed = head_embed_sum_.TakeRoot();  // the head's part, then the lookups'
    std::vector<T> lookup = lookup_embed_sum_.TakeRoot();
    if (!tied_summed_) AddVector(r.grad.embed, lookup);
  } else {  // an untied head: its partials are lm_head's gradient, the lookups the embedding's
    r.grad.lm_head = head_embed_sum_.TakeRoot();
    r.grad.embed = lookup_embed_sum_.TakeRoot();
  }
  r.grad.norm_f = norm_f_sum_.TakeRoot();
  // The halo parts of dL/du^0 that span s sent for span s - 1's last rows: their lookups.
  for (int64_t s = 1; s < S_; ++s) {
    const SpanRange& rg = plan_.range(s);
    const std::vector<T>& rows = du_halo_prev_[s];
    for (int64_t t = rg.t0 - rg.halo; t < rg.t0; ++t) {
      T* e = r.grad.embed.data() + int64_t{tokens_[t]} * D_;
      const T* row = rows.data() + (t - (rg.t0 - rg.halo)) * D_;
      for (int64_t d = 0; d < D_; ++d) e[d] += row[d];
    }
  }
  FinishLoss(r);
  return r;
}

template <typename T, template <typename> class P>
void SpanLedger<T, P>::FinishLoss(GradResult<T, P>& r) const {
  double loss = 0;
  int64_t correct = 0;
  for (int64_t s = 0; s < S_; ++s) loss += loss_[s], correct += correct_[s];
  r.loss = loss / static_cast<double>(n_targets_);
  r.targets = n_targets_;
  r.correct = mask_.empty() ? -1 : correct;
}

template <typename T, template <typename> class P>
int64_t SpanLedger<T, P>::held_bytes() const {
  int64_t b = Bytes(sigma_) + Bytes(h_end_) + Bytes(h0_) + Bytes(halo_next_) + Bytes(m_) +
              Bytes(mu_) + Bytes(du_halo_prev_);
  const int64_t layer =  // bytes of one layer's partial
      FamilyOfParams<P>::template LayerNumel<T>(p_.config) * static_cast<int64_t>(sizeof(T));
  for (const auto& t : layer_sums_) b += t.held() * layer;
  b += (head_embed_sum_.held() + lookup_embed_sum_.held()) *
       static_cast<int64_t>(p_.embed.size() * sizeof(T));
  return b;
}

template class FixedTreeSum<float>;  // scalars: tests/kernels/span_schedule_test.cc
template class FixedTreeSum<GroupValue<float>>;  // tests/kernels/tree_reduce_test.cc
template class FixedTreeSum<LayerParams<float>>;
template class FixedTreeSum<LayerParams<double>>;
template class FixedTreeSum<std::vector<float>>;
template class FixedTreeSum<std::vector<double>>;
template class FixedTreeSum<Mamba2Layer<float>>;
template class FixedTreeSum<Mamba2Layer<double>>;
template class FixedTreeSum<RowBuffer<float>>;  // a resident step's: engine/device_sums.h
template class FixedTreeSum<RowBuffer<double>>;
template class SpanLedger<float>;
template class SpanLedger<double>;
template class SpanLedger<float, Mamba2Params>;
template class SpanLedger<double, Mamba2Params>;

}  // namespace adjsh
