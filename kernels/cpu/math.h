// Element-wise math for the CPU kernels. Exp<float> is a branch-free exp that GCC vectorises
// (the scan evaluates exp(Delta_t A) Di*N times per token, so a libm call per element would
// dominate); Exp<double> is std::exp, since f64 is the check mode and must be as exact as libm.
#ifndef ADJSH_KERNELS_CPU_MATH_H_
#define ADJSH_KERNELS_CPU_MATH_H_

#include <bit>
#include <cmath>
#include <cstdint>

namespace adjsh::cpu {

// exp(x) for float, relative error below 2e-7 (about 2 ulp) on [-87, 88]; 0 below -87.3
// (where the true value is at most f32's smallest normal), +huge above 88.7. Cody-Waite range
// reduction x = k ln2 + r, |r| <= ln2/2, then a degree-7 Taylor polynomial (remainder
// |r|^8/8! < 3e-9).
inline float ExpFast(float x) {
  const float xc = x > 88.7f ? 88.7f : x;
  const float kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to int
  const float r = (xc - kf * 0.693145751953125f) - kf * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(kf) + 127) << 23;
  const float scaled = p * std::bit_cast<float>(bits);
  return x < -87.3f ? 0.0f : scaled;
}

template <typename T>
inline T Exp(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return ExpFast(x);
  } else {
    return std::exp(x);
  }
}

template <typename T>
inline T Sigmoid(T x) {
  return T(1) / (T(1) + Exp<T>(-x));
}

template <typename T>
inline T Silu(T x) {
  return x * Sigmoid(x);
}

// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x).
template <typename T>
inline T SiluGrad(T x) {
  const T s = Sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

// softplus(x) = log(1 + e^x), as PyTorch computes it: x itself above 20.
template <typename T>
inline T Softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_MATH_H_
