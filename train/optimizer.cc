#include "train/optimizer.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace adjsh::train {

double LearningRate(const AdamWOptions& opt, int64_t step, int64_t total_steps) {
  if (opt.warmup_steps > 0 && step < opt.warmup_steps) {
    return opt.lr * static_cast<double>(step + 1) / static_cast<double>(opt.warmup_steps);
  }
  const int64_t decay_steps = total_steps - opt.warmup_steps;
  if (decay_steps <= 1) return opt.lr;
  const double progress =
      static_cast<double>(step - opt.warmup_steps) / static_cast<double>(decay_steps - 1);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(1.0, progress)));
  return opt.lr * (opt.min_lr_ratio + (1.0 - opt.min_lr_ratio) * cosine);
}

bool DecaysWeight(const std::string& name) {
  for (const char* suffix : {"in_proj.weight", "conv1d.weight", "x_proj.weight",
                             "dt_proj.weight", "out_proj.weight", "embeddings.weight",
                             "lm_head.weight"}) {
    const std::string s(suffix);
    if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      return true;
    }
  }
  return false;
}

template <typename P>
double GradNorm(P& grad) {
  double sum = 0;
  for (const ParamRef<float>& g : ListParams(grad))
    for (float x : *g.values) sum += double(x) * double(x);
  return std::sqrt(sum);
}

AdamWState<ModelParams<float>> NewAdamWState(const MambaConfig& config) {
  return {0, ZeroParams<float>(config), ZeroParams<float>(config)};
}

AdamWState<Mamba2Params<float>> NewAdamWState(const Mamba2Config& config) {
  return {0, ZeroMamba2Params<float>(config), ZeroMamba2Params<float>(config)};
}

template <typename P>
absl::Status AdamWStep(const AdamWOptions& opt, double lr, float clip_scale, P& params, P& grad,
                       AdamWState<P>& state) {
  const int64_t t = state.step + 1;
  const double bc1 = 1.0 - std::pow(opt.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(opt.beta2, static_cast<double>(t));
  const float b1 = float(opt.beta1), b2 = float(opt.beta2), eps = float(opt.eps);
  const float step_size = float(lr / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  auto p = ListParams(params), g = ListParams(grad), m = ListParams(state.m),
       v = ListParams(state.v);
  // Two passes over the same arithmetic: the first only checks that every new value is finite
  // (a finite but huge gradient element can still overflow g^2), the second writes. A step that
  // would leave a NaN or Inf anywhere in the parameters or moments changes nothing.
  for (const bool write : {false, true}) {
    for (size_t k = 0; k < p.size(); ++k) {
      const float decay = DecaysWeight(p[k].name) ? float(1.0 - lr * opt.weight_decay) : 1.0f;
      std::vector<float>& pv = *p[k].values;
      const std::vector<float>& gv = *g[k].values;
      std::vector<float>& mv = *m[k].values;
      std::vector<float>& vv = *v[k].values;
      for (size_t i = 0; i < pv.size(); ++i) {
        const float gi = gv[i] * clip_scale;
        const float mi = b1 * mv[i] + (1.0f - b1) * gi;
        const float vi = b2 * vv[i] + (1.0f - b2) * gi * gi;
        const float pi = pv[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
        if (write) {
          pv[i] = pi, mv[i] = mi, vv[i] = vi;
        } else if (!std::isfinite(pi) || !std::isfinite(mi) || !std::isfinite(vi)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "update ", t, " would make ", p[k].name, "[", i, "] or its AdamW moments "
              "non-finite (gradient element ", gv[i], "): training diverged; nothing applied"));
        }
      }
    }
  }
  state.step = t;
  return absl::OkStatus();
}

#define ADJSH_INSTANTIATE(P)                                                                  \
  template double GradNorm<P>(P&);                                                            \
  template absl::Status AdamWStep<P>(const AdamWOptions&, double, float, P&, P&,              \
                                     AdamWState<P>&);
ADJSH_INSTANTIATE(ModelParams<float>)
ADJSH_INSTANTIATE(Mamba2Params<float>)
#undef ADJSH_INSTANTIATE

}  // namespace adjsh::train
