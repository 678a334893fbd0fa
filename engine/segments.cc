#include "engine/segments.h"

#include "common/check.h"

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

template <typename T>
GradResult<T> CombineGradients(std::vector<GradResult<T>> parts) {
  ADJSH_CHECK(!parts.empty(), "no gradient to combine");
  if (parts.size() == 1) return std::move(parts[0]);
  int64_t targets = 0;
  for (const GradResult<T>& p : parts) targets += p.targets;
  GradResult<T> total = std::move(parts[0]);
  const T w0 = static_cast<T>(static_cast<double>(total.targets) / static_cast<double>(targets));
  double loss = total.loss * static_cast<double>(total.targets);
  const std::vector<ParamRef<T>> dst = ListParams(total.grad);
  for (const ParamRef<T>& t : dst)
    for (T& v : *t.values) v *= w0;
  for (size_t b = 1; b < parts.size(); ++b) {
    GradResult<T>& p = parts[b];
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
    total.profile.tasks += p.profile.tasks;
    total.profile.wire_bytes += p.profile.wire_bytes;
  }
  total.loss = loss / static_cast<double>(targets);
  total.targets = targets;
  return total;
}

template GradResult<float> CombineGradients<float>(std::vector<GradResult<float>>);
template GradResult<double> CombineGradients<double>(std::vector<GradResult<double>>);

}  // namespace adjsh
