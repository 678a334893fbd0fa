// The reproducible random streams of the published initialisations (common/model_init.cc for
// Mamba-1, common/mamba2_init.cc for Mamba-2): every tensor draws from its own
// std::mt19937_64, seeded from (seed, tensor name), with the uniform and normal transforms
// written out here, so values depend neither on the standard library's <random>
// distributions nor on the order tensors are filled in.
#ifndef ADJSH_COMMON_INIT_RNG_H_
#define ADJSH_COMMON_INIT_RNG_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <string_view>
#include <vector>

#include "common/hash.h"

namespace adjsh {

// SplitMix64 spreads (seed, name hash) over all 64 bits before seeding mt19937_64.
inline uint64_t StreamSeed(uint64_t seed, std::string_view name) {
  uint64_t h = kFnv1aBasis;  // FNV-1a of the tensor name
  for (char ch : name) h = Fnv1a(h, static_cast<uint8_t>(ch));
  return SplitMix64(SplitMix64(seed) ^ h);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

  // Standard normal by Box-Muller; the second value of each pair is kept for the next call.
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - Uniform();  // (0, 1]: log is finite
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    spare_ = r * std::sin(angle);
    has_spare_ = true;
    return r * std::cos(angle);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

template <typename T>
void FillNormal(std::vector<T>& v, Rng& rng, double stddev) {
  for (T& x : v) x = static_cast<T>(stddev * rng.Normal());
}

template <typename T>
void FillUniform(std::vector<T>& v, Rng& rng, double bound) {
  for (T& x : v) x = static_cast<T>(bound * (2.0 * rng.Uniform() - 1.0));
}

// The dt bias: softplus^-1(dt), dt = exp(u (ln 0.1 - ln 0.001) + ln 0.001) >= 1e-4, u uniform
// in [0, 1) (mamba_ssm's dt_min 0.001, dt_max 0.1, dt_init_floor 1e-4).
template <typename T>
void FillDtBias(std::vector<T>& v, Rng& rng) {
  const double log_min = std::log(1e-3), log_max = std::log(1e-1);
  for (T& x : v) {
    const double dt = std::max(std::exp(rng.Uniform() * (log_max - log_min) + log_min), 1e-4);
    x = static_cast<T>(dt + std::log(-std::expm1(-dt)));  // softplus(x) = dt
  }
}

}  // namespace adjsh

#endif  // ADJSH_COMMON_INIT_RNG_H_
