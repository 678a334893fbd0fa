// Vectors of channels for the channel-blocked scans (kernels/cpu/scan_block_impl.h): lane c of
// a vector is inner channel i0 + c of one token's row, so a row's V channels are one contiguous
// load and the V recurrences of a block advance together, each lane its own dependent chain.
//
// Every vector type here computes, lane by lane, exactly what the scalar code of math.h computes
// (MulAdd, Decay), and its one cross-lane operation, the sum of a vector's lanes,
// always associates as the pairwise tree
//   ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))     (V = 8; (c0 + c1) + (c2 + c3) for V = 4)
// so the AVX2 types and the portable Lanes<T, V> give the same bits: a result does not depend on
// the instruction set a worker was built for, only on V (8 for f32, 4 for f64 everywhere).
#ifndef ADJSH_KERNELS_CPU_SIMD_H_
#define ADJSH_KERNELS_CPU_SIMD_H_

#include <cmath>
#include <cstdint>

#include "kernels/cpu/math.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ADJSH_SIMD_AVX2 1
#if defined(__AVX512F__)
#define ADJSH_SIMD_AVX512 1
#endif
#endif

namespace adjsh::cpu::simd {

// Lane count of the blocked scans for T: fixed per type, never per machine (see above).
template <typename T>
inline constexpr int kWidth = sizeof(T) == 4 ? 8 : 4;

// Portable V lanes of T: plain loops over the lanes with the scalar operations of math.h.
template <typename T, int V>
struct Lanes {
  using Scalar = T;
  static constexpr int kLanes = V;
  T v[V];

  static Lanes Load(const T* p) {
    Lanes r;
    for (int c = 0; c < V; ++c) r.v[c] = p[c];
    return r;
  }
  static Lanes Set(T x) {
    Lanes r;
    for (int c = 0; c < V; ++c) r.v[c] = x;
    return r;
  }
  void Store(T* p) const {
    for (int c = 0; c < V; ++c) p[c] = v[c];
  }
  friend Lanes operator+(Lanes a, Lanes b) {
    for (int c = 0; c < V; ++c) a.v[c] += b.v[c];
    return a;
  }
  friend Lanes operator*(Lanes a, Lanes b) {
    for (int c = 0; c < V; ++c) a.v[c] *= b.v[c];
    return a;
  }
  // a * b + c, rounded as MulAdd (math.h).
  static Lanes Fma(Lanes a, Lanes b, Lanes c) {
    for (int k = 0; k < V; ++k) a.v[k] = MulAdd(a.v[k], b.v[k], c.v[k]);
    return a;
  }
  // DecayCoef and Decay (math.h) lane by lane.
  static Lanes DecayCoef(Lanes A) {
    for (int c = 0; c < V; ++c) A.v[c] = cpu::DecayCoef<T>(A.v[c]);
    return A;
  }
  static Lanes Decay(Lanes dt, Lanes coef) {
    for (int c = 0; c < V; ++c) dt.v[c] = cpu::Decay<T>(dt.v[c], coef.v[c]);
    return dt;
  }
  // The pairwise tree over lanes [lo, lo + n), n a power of two.
  T SumRange(int lo, int n) const {
    return n == 1 ? v[lo] : SumRange(lo, n / 2) + SumRange(lo + n / 2, n / 2);
  }
  T Sum() const { return SumRange(0, V); }
  // Lane g of the result is p[g].Sum(), for g < V.
  static Lanes SumEach(const Lanes* p) {
    Lanes r;
    for (int g = 0; g < V; ++g) r.v[g] = p[g].Sum();
    return r;
  }
};

#ifdef ADJSH_SIMD_AVX2
struct F32x8 {
  using Scalar = float;
  static constexpr int kLanes = 8;
  __m256 v;

  static F32x8 Load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static F32x8 Set(float x) { return {_mm256_set1_ps(x)}; }
  void Store(float* p) const { _mm256_storeu_ps(p, v); }
  friend F32x8 operator+(F32x8 a, F32x8 b) { return {_mm256_add_ps(a.v, b.v)}; }
  friend F32x8 operator*(F32x8 a, F32x8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
  static F32x8 Fma(F32x8 a, F32x8 b, F32x8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
  static F32x8 DecayCoef(F32x8 A) {
    return {_mm256_mul_ps(A.v, _mm256_set1_ps(1.44269504088896341f))};
  }
  // Decay (math.h): Exp2Fast(dt * coef) on 8 lanes, step for step. max(lo, y) and min(hi, y)
  // return y when y is NaN, as the scalar clamps do.
  static F32x8 Decay(F32x8 dt, F32x8 coef) {
    const __m256 y = _mm256_mul_ps(dt.v, coef.v);
    const __m256 yc =
        _mm256_min_ps(_mm256_set1_ps(127.0f), _mm256_max_ps(_mm256_set1_ps(-125.0f), y));
    const __m256 shift = _mm256_set1_ps(12582912.0f);
    const __m256 t = _mm256_add_ps(yc, shift);
    const __m256 r = _mm256_sub_ps(yc, _mm256_sub_ps(t, shift));
    __m256 p = _mm256_set1_ps(1.327647245e-03f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(9.675540961e-03f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.550713092e-02f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.402212024e-01f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(6.931469440e-01f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.000000119e+00f));
    const __m256i k = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
    return {_mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), k))};
  }
  float Sum() const {
    const __m256 h = _mm256_hadd_ps(v, v);  // [c0 + c1, c2 + c3, ., . | c4 + c5, c6 + c7, ., .]
    const __m256 q = _mm256_hadd_ps(h, h);  // lane 0: (c0 + c1) + (c2 + c3); lane 4: the rest
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1)));
  }
  static F32x8 SumEach(const F32x8* p) {
    // q0 = [p0..p3 low-half sums | p0..p3 high-half sums], q1 the same for p4..p7.
    const __m256 q0 =
        _mm256_hadd_ps(_mm256_hadd_ps(p[0].v, p[1].v), _mm256_hadd_ps(p[2].v, p[3].v));
    const __m256 q1 =
        _mm256_hadd_ps(_mm256_hadd_ps(p[4].v, p[5].v), _mm256_hadd_ps(p[6].v, p[7].v));
    return {
        _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31))};
  }
};

struct F64x4 {
  using Scalar = double;
  static constexpr int kLanes = 4;
  __m256d v;

  static F64x4 Load(const double* p) { return {_mm256_loadu_pd(p)}; }
  static F64x4 Set(double x) { return {_mm256_set1_pd(x)}; }
  void Store(double* p) const { _mm256_storeu_pd(p, v); }
  friend F64x4 operator+(F64x4 a, F64x4 b) { return {_mm256_add_pd(a.v, b.v)}; }
  friend F64x4 operator*(F64x4 a, F64x4 b) { return {_mm256_mul_pd(a.v, b.v)}; }
  static F64x4 Fma(F64x4 a, F64x4 b, F64x4 c) { return {_mm256_fmadd_pd(a.v, b.v, c.v)}; }
  static F64x4 DecayCoef(F64x4 A) { return A; }
  static F64x4 Decay(F64x4 dt, F64x4 coef) {  // std::exp per lane: exact as libm
    alignas(32) double x[4];
    _mm256_store_pd(x, _mm256_mul_pd(dt.v, coef.v));
    for (double& e : x) e = std::exp(e);
    return {_mm256_load_pd(x)};
  }
  double Sum() const {
    const __m256d h = _mm256_hadd_pd(v, v);  // [c0 + c1, ., c2 + c3, .]
    return _mm_cvtsd_f64(_mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1)));
  }
  static F64x4 SumEach(const F64x4* p) {
    const __m256d x = _mm256_hadd_pd(p[0].v, p[1].v);  // [p0 01, p1 01 | p0 23, p1 23]
    const __m256d y = _mm256_hadd_pd(p[2].v, p[3].v);
    return {_mm256_add_pd(_mm256_permute2f128_pd(x, y, 0x20), _mm256_permute2f128_pd(x, y, 0x31))};
  }
};

#ifdef ADJSH_SIMD_AVX512
// Two 8-channel blocks side by side in one 512-bit vector (lanes 0-7: channels i0..i0+7, lanes
// 8-15: the next block). Every lane computes what F32x8 computes (Decay: for every argument a
// scan passes), and the kernels sum its lanes block by block (Half), so a result is F32x8's bit
// for bit, in half the instructions.
struct F32x8x2 {
  using Scalar = float;
  static constexpr int kLanes = 16;
  __m512 v;

  static F32x8x2 Load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static F32x8x2 Set(float x) { return {_mm512_set1_ps(x)}; }
  void Store(float* p) const { _mm512_storeu_ps(p, v); }
  friend F32x8x2 operator+(F32x8x2 a, F32x8x2 b) { return {_mm512_add_ps(a.v, b.v)}; }
  friend F32x8x2 operator*(F32x8x2 a, F32x8x2 b) { return {_mm512_mul_ps(a.v, b.v)}; }
  static F32x8x2 Fma(F32x8x2 a, F32x8x2 b, F32x8x2 c) {
    return {_mm512_fmadd_ps(a.v, b.v, c.v)};
  }
  static F32x8x2 DecayCoef(F32x8x2 A) {
    return {_mm512_mul_ps(A.v, _mm512_set1_ps(1.44269504088896341f))};
  }
  // F32x8::Decay on 16 lanes. The maskz forms with every lane set are the plain instructions;
  // GCC 12's plain intrinsics start from an "undefined" vector that -Wmaybe-uninitialized flags.
  static F32x8x2 Decay(F32x8x2 dt, F32x8x2 coef) {
    constexpr __mmask16 kAll = 0xFFFF;
    // The upper clamp at 127 is left out: y = Delta (A log2 e) <= 0 for every argument a scan
    // passes (Delta = softplus >= 0, A = -exp(A_log) < 0), where it never acts.
    const __m512 y = _mm512_mul_ps(dt.v, coef.v);
    const __m512 yc = _mm512_maskz_max_ps(kAll, _mm512_set1_ps(-125.0f), y);
    // k = yc rounded to the nearest integer (ties to even, as the shift trick rounds), r = yc - k
    // exactly, and p 2^k by vscalefps: the exponent-field add of F32x8 gives the same bits for
    // every clamped argument y <= 127 (p in [0.7, 1.42], k in [-125, 127]: a normal result),
    // in two instructions fewer.
    const __m512 k = _mm512_maskz_roundscale_ps(kAll, yc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(yc, k);
    __m512 p = _mm512_set1_ps(1.327647245e-03f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.675540961e-03f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550713092e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.402212024e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931469440e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.000000119e+00f));
    return {_mm512_maskz_scalef_ps(kAll, p, k)};
  }
  // For 16 vectors p[0..15]: lane n of s0 is p[n].Half(0).Sum(), lane n of s1 is
  // p[n].Half(1).Sum(), each the pairwise tree of F32x8::Sum. Three levels of "even lanes +
  // odd lanes" of two vectors (vpermt2ps): level 1 leaves in each lane the sum of a lane pair
  // (c0 + c1, c2 + c3, ...), level 2 sums adjacent pairs, level 3 adjacent quads, so each lane
  // ends as ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)) of one half of one p[n]; lanes
  // come out ordered (n, half), and a last even/odd split gives s0 and s1.
  static void SumHalves16(const F32x8x2* p, F32x8x2& s0, F32x8x2& s1) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    auto pair = [&](__m512 a, __m512 b) {
      return _mm512_add_ps(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
    };
    __m512 l1[8], l2[4], l3[2];
    for (int k = 0; k < 8; ++k) l1[k] = pair(p[2 * k].v, p[2 * k + 1].v);
    for (int k = 0; k < 4; ++k) l2[k] = pair(l1[2 * k], l1[2 * k + 1]);
    for (int k = 0; k < 2; ++k) l3[k] = pair(l2[2 * k], l2[2 * k + 1]);
    s0.v = _mm512_permutex2var_ps(l3[0], even, l3[1]);
    s1.v = _mm512_permutex2var_ps(l3[0], odd, l3[1]);
  }
  // Block h's 8 lanes (h = 0 or 1).
  F32x8 Half(int h) const {
    const __m512d d = _mm512_castps_pd(v);  // (maskz, and no cast to 256 bits: see Decay)
    return {_mm256_castpd_ps(h == 0 ? _mm512_maskz_extractf64x4_pd(0xFF, d, 0)
                                    : _mm512_maskz_extractf64x4_pd(0xFF, d, 1))};
  }
};
#endif

// The widest type that computes as T's native vectors do: F32x8x2 where AVX-512 is, else the
// native type itself. The kernels run their full blocks in it and what is left in Native<T>.
template <class VT>
struct WideOf {
  using type = VT;
};
#ifdef ADJSH_SIMD_AVX512
template <>
struct WideOf<F32x8> {
  using type = F32x8x2;
};
#endif
template <class VT>
using Wide = typename WideOf<VT>::type;

template <typename T>
struct NativeOf;
template <>
struct NativeOf<float> {
  using type = F32x8;
};
template <>
struct NativeOf<double> {
  using type = F64x4;
};
template <typename T>
using Native = typename NativeOf<T>::type;
#else
template <typename T>
using Native = Lanes<T, kWidth<T>>;
template <class VT>
using Wide = VT;
#endif

}  // namespace adjsh::cpu::simd

#endif  // ADJSH_KERNELS_CPU_SIMD_H_
