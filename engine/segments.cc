#include "engine/segments.h"

#include <algorithm>

#include "common/check.h"
#include "common/mamba2_model.h"

namespace adjsh {

std::vector<std::pair<int64_t, int64_t>> PiecesAtStarts(int64_t T,
                                                        std::span<const int64_t> starts) {
  std::vector<std::pair<int64_t, int64_t>> pieces;
  int64_t a = 0;
  for (int64_t s : starts) {
    if (s <= a || s >= T) continue;
    pieces.emplace_back(a, s - a + 1);  // rows [a, s) and the target token s
    a = s;
  }
  if (T - a >= 2) pieces.emplace_back(a, T - a);
  return pieces;
}

std::vector<std::pair<int64_t, int64_t>> PiecesOfWindow(int64_t start, int64_t len,
                                                        std::span<const int64_t> doc_starts) {
  std::vector<int64_t> cuts;  // the starts inside the window, relative to it
  for (auto it = std::upper_bound(doc_starts.begin(), doc_starts.end(), start);
       it != doc_starts.end() && *it < start + len; ++it)
    cuts.push_back(*it - start);
  return PiecesAtStarts(len, cuts);
}

template <typename T, template <typename> class Params>
GradResult<T, Params> CombineGradients(std::vector<GradResult<T, Params>> parts) {
  ADJSH_CHECK(!parts.empty(), "no gradient to combine");
  if (parts.size() == 1) return std::move(parts[0]);
  int64_t targets = 0;
  for (const GradResult<T, Params>& p : parts) targets += p.targets;
  GradResult<T, Params> total = std::move(parts[0]);
  const T w0 = static_cast<T>(static_cast<double>(total.targets) / static_cast<double>(targets));
  double loss = total.loss * static_cast<double>(total.targets);
  const std::vector<ParamRef<T>> dst = ListParams(total.grad);
  for (const ParamRef<T>& t : dst)
    for (T& v : *t.values) v *= w0;
  for (size_t b = 1; b < parts.size(); ++b) {
    GradResult<T, Params>& p = parts[b];
    const T w = static_cast<T>(static_cast<double>(p.targets) / static_cast<double>(targets));
    loss += p.loss * static_cast<double>(p.targets);
    const std::vector<ParamRef<T>> src = ListParams(p.grad);
    for (size_t q = 0; q < dst.size(); ++q) {
      std::vector<T>& d = *dst[q].values;
      const std::vector<T>& v = *src[q].values;
      for (size_t k = 0; k < d.size(); ++k) d[k] += w * v[k];
    }
    if (total.correct >= 0) total.correct += p.correct;
    total.stored_bytes = std::max(total.stored_bytes, p.stored_bytes);
    // The parts are independent: their tasks add up, and the chain of dependent tasks that
    // bounds them all is the longest of theirs (parallelism: what they allow together, whether
    // they ran at once, as a batch through workers does, or one after another). Wall seconds:
    // the longest part's.
    StepProfile& t = total.profile;
    const StepProfile& q = p.profile;
    t.tasks += q.tasks, t.spans += q.spans, t.rebuilt_spans += q.rebuilt_spans;
    t.tokens += q.tokens, t.task_seconds += q.task_seconds, t.wire_bytes += q.wire_bytes;
    t.critical_path_seconds = std::max(t.critical_path_seconds, q.critical_path_seconds);
    t.parallelism = t.critical_path_seconds > 0 ? t.task_seconds / t.critical_path_seconds : 0;
    t.wall_seconds = std::max(t.wall_seconds, q.wall_seconds);
    t.tree_workers = std::max(t.tree_workers, q.tree_workers);
    t.restarts = std::max(t.restarts, q.restarts);
  }
  total.loss = loss / static_cast<double>(targets);
  total.targets = targets;
  return total;
}

template GradResult<float> CombineGradients(std::vector<GradResult<float>>);
template GradResult<double> CombineGradients(std::vector<GradResult<double>>);
template GradResult<float, Mamba2Params> CombineGradients(
    std::vector<GradResult<float, Mamba2Params>>);
template GradResult<double, Mamba2Params> CombineGradients(
    std::vector<GradResult<double, Mamba2Params>>);

}  // namespace adjsh
