#include "kernels/cpu/lm_head.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/math.h"
#include "kernels/cpu/rmsnorm.h"

namespace adjsh::cpu {

namespace {

// nf (M, D) = rmsnorm(u; w_f), r (M) its reciprocal rms, logits (M, V) = nf E^T.
template <typename T>
void Logits(const LmHeadArgs<T>& g, T* logits, T* nf, std::vector<T>& r) {
  r.resize(g.M);
  RmsNormForward(g.u, g.M, g.D, g.w_f, g.eps, nf, r.data());
  Gemm<T>(Trans::kNo, Trans::kYes, g.M, g.V, g.D, 1, nf, g.D, g.E, g.D, 0, logits, g.V);
}

}  // namespace

template <typename T>
double LmHeadForwardBackward(const LmHeadArgs<T>& g, T* du, T* dlogits, T* nf, T* dw_f) {
  const int64_t M = g.M, D = g.D, V = g.V;
  std::vector<T> r;
  Logits(g, dlogits, nf, r);
  double loss = 0;
  for (int64_t t = 0; t < M; ++t) {
    T* row = dlogits + t * V;
    const int64_t target = g.targets[t];
    if (target < 0) {
      std::fill(row, row + V, T(0));
      continue;
    }
    const T mx = *std::max_element(row, row + V);
    if (g.correct != nullptr && row[target] >= mx) ++*g.correct;
    const T shifted_target = row[target] - mx;
    T sum = 0;
    for (int64_t v = 0; v < V; ++v) {
      row[v] = Exp<T>(row[v] - mx);  // row now holds exp(logit - max)
      sum += row[v];
    }
    // loss = logsumexp - logit[target] = log(sum) - (logit[target] - max)
    loss += static_cast<double>(std::log(sum)) - static_cast<double>(shifted_target);
    const T inv = g.scale / sum;
    for (int64_t v = 0; v < V; ++v) row[v] *= inv;
    row[target] -= g.scale;
  }
  // dnf = dlogits E, then the final norm's backward.
  std::vector<T> dnf(M * D);
  Gemm<T>(Trans::kNo, Trans::kNo, M, D, V, 1, dlogits, V, g.E, D, 0, dnf.data(), D);
  RmsNormBackward(g.u, M, D, g.w_f, r.data(), dnf.data(), dw_f, du);
  return loss;
}

template <typename T>
double LmHeadLoss(const LmHeadArgs<T>& g, T* logits, T* nf) {
  const int64_t M = g.M, V = g.V;
  std::vector<T> r;
  Logits(g, logits, nf, r);
  double loss = 0;
  for (int64_t t = 0; t < M; ++t) {
    const T* row = logits + t * V;
    const int64_t target = g.targets[t];
    if (target < 0) continue;
    const T mx = *std::max_element(row, row + V);
    if (g.correct != nullptr && row[target] >= mx) ++*g.correct;
    T sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += Exp<T>(row[v] - mx);
    loss += static_cast<double>(std::log(sum)) - static_cast<double>(row[target] - mx);
  }
  return loss;
}

template double LmHeadForwardBackward<float>(const LmHeadArgs<float>&, float*, float*, float*,
                                             float*);
template double LmHeadForwardBackward<double>(const LmHeadArgs<double>&, double*, double*,
                                              double*, double*);

template double LmHeadLoss<float>(const LmHeadArgs<float>&, float*, float*);
template double LmHeadLoss<double>(const LmHeadArgs<double>&, double*, double*);

}  // namespace adjsh::cpu
