#include "common/mamba2_init.h"

#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "common/init_rng.h"

namespace adjsh {

template <typename T>
absl::StatusOr<Mamba2Params<T>> InitMamba2Params(const Mamba2Config& config, uint64_t seed) {
  if (absl::Status s = ValidateMamba2Config(config); !s.ok()) return s;
  Mamba2Params<T> p = ZeroMamba2Params<T>(config);
  const double W = static_cast<double>(config.conv_kernel);
  const double K = static_cast<double>(config.num_hidden_layers);
  for (const ParamRef<T>& r : ListParams(p)) {
    Rng rng(StreamSeed(seed, r.name));
    std::vector<T>& v = *r.values;
    const auto is = [&](const char* suffix) { return absl::EndsWith(r.name, suffix); };
    if (is("out_proj.weight")) {
      FillNormal(v, rng, 0.02 / std::sqrt(K));
    } else if (is("embeddings.weight") || is("lm_head.weight") || is("in_proj.weight")) {
      FillNormal(v, rng, 0.02);
    } else if (is("conv1d.weight") || is("conv1d.bias")) {
      FillUniform(v, rng, 1.0 / std::sqrt(W));
    } else if (is("dt_bias")) {
      FillDtBias(v, rng);
    } else if (is("A_log")) {
      for (T& x : v) x = static_cast<T>(std::log(1.0 + 15.0 * rng.Uniform()));
    } else {  // D, the layer norms, the gated norm, norm_f
      std::fill(v.begin(), v.end(), T{1});
    }
  }
  return p;
}

template absl::StatusOr<Mamba2Params<float>> InitMamba2Params<float>(const Mamba2Config&,
                                                                     uint64_t);
template absl::StatusOr<Mamba2Params<double>> InitMamba2Params<double>(const Mamba2Config&,
                                                                       uint64_t);

}  // namespace adjsh
