#include "train/optimizer.h"

#include <cmath>
#include <numbers>

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
                             "dt_proj.weight", "out_proj.weight", "embeddings.weight"}) {
    const std::string s(suffix);
    if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      return true;
    }
  }
  return false;
}

double GradNorm(ModelParams<float>& grad) {
  double sum = 0;
  for (const ParamRef<float>& g : ListParams(grad))
    for (float x : *g.values) sum += double(x) * double(x);
  return std::sqrt(sum);
}

AdamWState NewAdamWState(const MambaConfig& config) {
  return AdamWState{0, ZeroParams<float>(config), ZeroParams<float>(config)};
}

void AdamWStep(const AdamWOptions& opt, double lr, float clip_scale, ModelParams<float>& params,
               ModelParams<float>& grad, AdamWState& state) {
  ++state.step;
  const double bc1 = 1.0 - std::pow(opt.beta1, static_cast<double>(state.step));
  const double bc2 = 1.0 - std::pow(opt.beta2, static_cast<double>(state.step));
  const float b1 = float(opt.beta1), b2 = float(opt.beta2), eps = float(opt.eps);
  const float step_size = float(lr / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  auto p = ListParams(params), g = ListParams(grad), m = ListParams(state.m),
       v = ListParams(state.v);
  for (size_t k = 0; k < p.size(); ++k) {
    const float decay = DecaysWeight(p[k].name) ? float(1.0 - lr * opt.weight_decay) : 1.0f;
    std::vector<float>& pv = *p[k].values;
    const std::vector<float>& gv = *g[k].values;
    std::vector<float>& mv = *m[k].values;
    std::vector<float>& vv = *v[k].values;
    for (size_t i = 0; i < pv.size(); ++i) {
      const float gi = gv[i] * clip_scale;
      pv[i] *= decay;
      mv[i] = b1 * mv[i] + (1.0f - b1) * gi;
      vv[i] = b2 * vv[i] + (1.0f - b2) * gi * gi;
      pv[i] -= step_size * mv[i] / (std::sqrt(vv[i]) * inv_sqrt_bc2 + eps);
    }
  }
}

}  // namespace adjsh::train
