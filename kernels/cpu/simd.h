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
    const __m512 k =
        _mm512_maskz_roundscale_ps(kAll, yc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(yc, k);
    __m512 p = _mm512_set1_ps(1.327647245e-03f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.675540961e-03f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550713092e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.402212024e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931469440e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.000000119e+00f));
    return {_mm512_maskz_scalef_ps(kAll, p, k)};
  }
  // For 8 vectors p[0..7]: lane n (n < 8) of the result is p[n].Half(0).Sum() and lane 8 + n
  // is p[n].Half(1).Sum(), each the pairwise tree of F32x8::Sum, in the 128-bit lanes where
  // that sum's own hadds run. H(a, b), two in-lane vshufps and an add, is vhaddps on all four
  // 128-bit lanes: [a0 + a1, a2 + a3, b0 + b1, b2 + b3] in lane 0, and so on. Two levels of H
  // leave in 128-bit lane j of H(H(p0, p1), H(p2, p3)) the four sums (c0 + c1) + (c2 + c3) of
  // lanes 4j.. 4j + 3 of p0 .. p3, a half's low and high quads in lanes 2h and 2h + 1; one add
  // of lanes regrouped by vshuff32x4 sums the quads as F32x8::Sum does. 12 vshufps, 3 vshuff32x4
  // and 7 adds for the 16 sums, where extracting each half and summing it with F32x8::SumEach
  // took twice the instructions, and a vpermt2ps tree ran slower.
  static F32x8x2 SumHalves8(const F32x8x2* p) {
    auto h = [](__m512 a, __m512 b) {
      return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
    };
    const __m512 q0 = h(h(p[0].v, p[1].v), h(p[2].v, p[3].v));  // p0..p3 quads, lanes 0 - 3
    const __m512 q1 = h(h(p[4].v, p[5].v), h(p[6].v, p[7].v));  // p4..p7
    // [q0 quads 0 | q0 quads 2 | q1 quads 0 | q1 quads 2] + the same of quads 1 and 3.
    // (maskz with every lane set, as in Decay, for GCC 12's "undefined" start vector.)
    const __m512 s = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, q0, q1, 0x88),
                                   _mm512_maskz_shuffle_f32x4(0xFFFF, q0, q1, 0xDD));
    // [p0..3 half 0 | p0..3 half 1 | p4..7 half 0 | p4..7 half 1] -> halves apart.
    return {_mm512_maskz_shuffle_f32x4(0xFFFF, s, s, 0xD8)};
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
