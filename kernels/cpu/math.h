// Element-wise math for the CPU kernels. Exp<float> is a branch-free exp that GCC vectorises
// (the scan evaluates exp(Delta_t A) Di*N times per token, so a libm call per element would
// dominate); Exp<double> is std::exp, since f64 is the check mode and must be as exact as libm.
#ifndef ADJSH_KERNELS_CPU_MATH_H_
#define ADJSH_KERNELS_CPU_MATH_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace adjsh::cpu {

// Internal linkage (static inline), for the reason kernels/cpu/rmsnorm.h gives: each including
// file keeps its own copy, compiled with its own flags.

// a * b + c with one rounding where the target has a fused multiply-add instruction, else two.
// The CPU kernels compile with -ffp-contract=off (kernels/CMakeLists.txt), so the compiler
// never fuses on its own: a fusion it chose differently in a loop's vector body and its scalar
// copies made a task's result depend on its buffers' addresses. Every fusion is written here.
template <typename T>
static inline T MulAdd(T a, T b, T c) {
#if defined(__FP_FAST_FMAF) && defined(__FP_FAST_FMA)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// exp(x) for float, relative error below 2e-7 (about 2 ulp) on [-87.3, 88.7]; arguments are
// clamped to that range (below it the result is 1.2e-38 instead of a denormal or 0: an absolute
// difference under f32's smallest normal). Cody-Waite range reduction x = k ln2 + r,
// |r| <= ln2/2, then a degree-7 Taylor polynomial (remainder |r|^8/8! < 3e-9). Branch-free
// (min/max only), so loops over it vectorise.
static inline float ExpFast(float x) {
  const float xlo = x < -87.3f ? -87.3f : x;
  const float xc = xlo > 88.7f ? 88.7f : xlo;
  const float kf = MulAdd(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;  // round
  const float r = MulAdd(-kf, 1.428606765330187e-06f, MulAdd(-kf, 0.693145751953125f, xc));
  float p = 1.0f / 5040.0f;
  p = MulAdd(p, r, 1.0f / 720.0f);
  p = MulAdd(p, r, 1.0f / 120.0f);
  p = MulAdd(p, r, 1.0f / 24.0f);
  p = MulAdd(p, r, 1.0f / 6.0f);
  p = MulAdd(p, r, 0.5f);
  p = MulAdd(p, r, 1.0f);
  p = MulAdd(p, r, 1.0f);
  const int32_t bits = (static_cast<int32_t>(kf) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// 2^y for float, relative error below 2.2e-7 (about 2 ulp) on [-125, 127]; arguments are
// clamped to that range (below it the result is 2^-125, a normal float). y = k + r with k the
// nearest integer (read off the low mantissa bits of y + 1.5 2^23) and r = y - k exact,
// |r| <= 1/2; then a degree-5 minimax polynomial for 2^r (approximation error 7.5e-8), and k
// added to its exponent field. Cheaper than ExpFast (12 operations against 16), which is what
// the scans' decays are made of.
static inline float Exp2Fast(float y) {
  const float ylo = y < -125.0f ? -125.0f : y;
  const float yc = ylo > 127.0f ? 127.0f : ylo;
  const float t = yc + 12582912.0f;  // 1.5 2^23 + k
  const float r = yc - (t - 12582912.0f);
  float p = 1.327647245e-03f;
  p = MulAdd(p, r, 9.675540961e-03f);
  p = MulAdd(p, r, 5.550713092e-02f);
  p = MulAdd(p, r, 2.402212024e-01f);
  p = MulAdd(p, r, 6.931469440e-01f);
  p = MulAdd(p, r, 1.000000119e+00f);
  const uint32_t k_exponent = std::bit_cast<uint32_t>(t) << 23;  // k << 23, two's complement
  return std::bit_cast<float>(std::bit_cast<uint32_t>(p) + k_exponent);
}

// The scans' decay a = exp(Delta A) from Delta and the channel's coefficient DecayCoef(A):
// f32 2^(Delta (A log2 e)) through Exp2Fast; f64 exp(Delta A) exactly as libm (the check mode).
template <typename T>
static inline T DecayCoef(T A) {
  if constexpr (std::is_same_v<T, float>) {
    return A * 1.44269504088896341f;
  } else {
    return A;
  }
}
template <typename T>
static inline T Decay(T dt, T coef) {
  if constexpr (std::is_same_v<T, float>) {
    return Exp2Fast(dt * coef);
  } else {
    return std::exp(dt * coef);
  }
}

template <typename T>
static inline T Exp(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return ExpFast(x);
  } else {
    return std::exp(x);
  }
}

template <typename T>
static inline T Sigmoid(T x) {
  return T(1) / (T(1) + Exp<T>(-x));
}

template <typename T>
static inline T Silu(T x) {
  return x * Sigmoid(x);
}

// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x), for a caller that already holds s (one exp
// instead of two).
template <typename T>
static inline T SiluGradGivenSigmoid(T x, T s) {
  return s * (T(1) + x * (T(1) - s));
}

template <typename T>
static inline T SiluGrad(T x) {
  return SiluGradGivenSigmoid(x, Sigmoid(x));
}

// log(1 + e) for e in [0, 1], float, branch-free: 2 atanh(s) with s = e / (2 + e) in [0, 1/3],
// series to s^15 (remainder < 3^-17 / 17 < 5e-10 absolute), Horner with fused multiply-adds.
static inline float Log1pUnit(float e) {
  const float s = e / (2.0f + e), s2 = s * s;
  float p = 1.0f / 15.0f;
  p = MulAdd(p, s2, 1.0f / 13.0f);
  p = MulAdd(p, s2, 1.0f / 11.0f);
  p = MulAdd(p, s2, 1.0f / 9.0f);
  p = MulAdd(p, s2, 1.0f / 7.0f);
  p = MulAdd(p, s2, 1.0f / 5.0f);
  p = MulAdd(p, s2, 1.0f / 3.0f);
  p = MulAdd(p, s2, 1.0f);
  return 2.0f * s * p;
}

// softplus(x) = log(1 + e^x). f64 follows PyTorch exactly (x itself above 20); f32 uses the
// smooth, vectorisable max(x, 0) + log(1 + e^-|x|), which differs from it by < 2.1e-9 (the value
// of log(1 + e^-20)) above 20, far below f32 resolution there.
template <typename T>
static inline T Softplus(T x) {
  if constexpr (std::is_same_v<T, float>) {
    const float ax = x < 0.0f ? -x : x;
    return (x > 0.0f ? x : 0.0f) + Log1pUnit(ExpFast(-ax));
  } else {
    return x > T(20) ? x : std::log1p(std::exp(x));
  }
}

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_MATH_H_
