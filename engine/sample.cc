#include "engine/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace adjsh {

template <typename T>
uint32_t SampleToken(const std::vector<T>& logits, const GenerateOptions& o, std::mt19937_64& rng) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (o.temperature == 0) {
    return static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int64_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  // The k largest, in decreasing logit order (ties: the lower id first), so that the draw
  // below walks a fixed order.
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double top = static_cast<double>(logits[ids[0]]);
  std::vector<double> p(k);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = std::exp((static_cast<double>(logits[ids[i]]) - top) / o.temperature);
    sum += p[i];
  }
  // A uniform in [0, 1) from 53 random bits (std::uniform_real_distribution's algorithm is
  // the library's own; this is the same on every platform).
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[i];
    if (u < acc) return static_cast<uint32_t>(ids[i]);
  }
  return static_cast<uint32_t>(ids[k - 1]);
}

template uint32_t SampleToken<float>(const std::vector<float>&, const GenerateOptions&,
                                     std::mt19937_64&);
template uint32_t SampleToken<double>(const std::vector<double>&, const GenerateOptions&,
                                      std::mt19937_64&);

}  // namespace adjsh
