// The channel-blocked scan kernels (scan_block.h), templated on the vector type VT of simd.h so
// that kernels/cpu/scan_block.cc instantiates them for the native vectors and
// tests/kernels/scan_block_test.cc also for the portable Lanes<T, V>, which must give the same
// bits. Full blocks of VT::kLanes channels run with VT, the last Di mod V channels one by one
// with Lanes<T, 1>. kN = 16 (Mamba's usual N) fixes the lane loops at compile time; kN = 0 reads
// N at run time.
//
// Per block, arrays indexed [n] hold one vector per state lane n: lane c is channel i0 + c.
#ifndef ADJSH_KERNELS_CPU_SCAN_BLOCK_IMPL_H_
#define ADJSH_KERNELS_CPU_SCAN_BLOCK_IMPL_H_

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/scan.h"
#include "kernels/cpu/simd.h"

namespace adjsh::cpu::blocked {

// Per-thread work arrays of vectors (slot: which array), grown, never shrunk. Slots 0 and 1:
// a backward block's a_t and h_t rows; 2 to 7: a block's Buf arrays when N is known only at run
// time; 8: the backward's row sums carried from one group of states to the next; 9: the
// block's columns of its (rows, Di) inputs, packed (PackColumns); 10: the backward block's
// columns of its (rows, Di) outputs, until they are written out.
template <class VT>
VT* Work(int slot, int64_t n) {
  thread_local std::vector<VT> slots[11];
  std::vector<VT>& v = slots[slot];
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

// Rows of Delta, x' and ybar are Di apart (2 KiB at Di = 512), so a block's walk over its rows
// reads a new cache line per row and array, and those lines fall in the same few L1 sets: with
// a prefetch a few rows ahead the prefetched lines still evicted one another, and the loads of a
// row's Delta and x' held most of the forward scan's time inside a gradient (perf annotate,
// docs/BENCHMARKS.md). So each block first copies its V columns of the arrays it reads, row by
// row, into one contiguous (rows, k) array of vectors: the copy's loads are independent of one
// another (the memory system overlaps their misses), and the scan then walks that array in
// order, forward or in reverse. The values are the same, so are the bits.
template <class VT>
const VT* PackColumns(int64_t rows, int64_t Di, int64_t i0, const typename VT::Scalar* p0,
                      const typename VT::Scalar* p1, const typename VT::Scalar* p2 = nullptr) {
  const int k = p2 ? 3 : 2;
  VT* dst = Work<VT>(9, k * rows);
  for (int64_t t = 0; t < rows; ++t, dst += k) {
    dst[0] = VT::Load(p0 + t * Di + i0);
    dst[1] = VT::Load(p1 + t * Di + i0);
    if (p2) dst[2] = VT::Load(p2 + t * Di + i0);
  }
  return dst - k * rows;
}

// The columns PackColumns will copy for the next block (channels i0 + kLanes on), fetched into
// L2 a row at a time while this block scans, so that its copy finds them there. Inside a
// gradient these arrays are out of cache: the span schedule's passes read activations a
// summary recomputed a phase earlier (kernels/cpu/mamba_block.h, Kept), and the copy's loads,
// which overlap only one another, held a good share of each scan's perf samples
// (docs/BENCHMARKS.md). A row's vector is one cache line (the arrays start on one: aligned.h).
// The last block fetches nothing.
template <class VT>
struct NextColumns {
  using T = typename VT::Scalar;
  const T* p[3] = {nullptr, nullptr, nullptr};
  int64_t Di;
  NextColumns(int64_t Di_, int64_t i0, const T* p0, const T* p1, const T* p2 = nullptr) : Di(Di_) {
    if (i0 + VT::kLanes >= Di) return;
    p[0] = p0 + i0 + VT::kLanes, p[1] = p1 + i0 + VT::kLanes;
    if (p2) p[2] = p2 + i0 + VT::kLanes;
  }
  __attribute__((always_inline)) void Fetch(int64_t t) const {
    for (const T* q : p)
      if (q) __builtin_prefetch(q + t * Di, 0, 2);
  }
};

// A block's per-state vectors, (N): on the stack when N is known at compile time (kN > 0), so
// that nothing aliases them and the compiler keeps them in registers, else a Work array.
template <class VT, int kN>
struct Buf {
  VT v[kN];
  Buf(int, int64_t) {}
  VT& operator[](int64_t n) { return v[n]; }
};
template <class VT>
struct Buf<VT, 0> {
  VT* v;
  Buf(int slot, int64_t n) : v(Work<VT>(slot, n)) {}
  VT& operator[](int64_t n) { return v[n]; }
};

// Lanes c of (Di, N)-shaped p at channel i0 + c, state n.
template <class VT>
VT Gather(const typename VT::Scalar* p, int64_t stride) {
  typename VT::Scalar tmp[VT::kLanes];
  for (int c = 0; c < VT::kLanes; ++c) tmp[c] = p[c * stride];
  return VT::Load(tmp);
}
template <class VT>
void Scatter(VT v, typename VT::Scalar* p, int64_t stride) {
  typename VT::Scalar tmp[VT::kLanes];
  v.Store(tmp);
  for (int c = 0; c < VT::kLanes; ++c) p[c * stride] = tmp[c];
}

// row[n] += sum over lanes of P[n], n < N: kLanes states at a time through SumEach.
template <class VT>
__attribute__((always_inline)) inline void AddLaneSums(const VT* P, int64_t N,
                                                       typename VT::Scalar* row) {
  constexpr int V = VT::kLanes;
  const int64_t full = N / V * V;
  for (int64_t n = 0; n < full; n += V) (VT::Load(row + n) + VT::SumEach(P + n)).Store(row + n);
  for (int64_t n = full; n < N; ++n) row[n] += P[n].Sum();
}

#ifdef ADJSH_SIMD_AVX512
// Two blocks at once: block 0's sums are added to the row before block 1's, as when the blocks
// run one after the other in F32x8. Eight states at a time (the backward's every group: G = 8)
// go through simd::SumHalves8, a transpose-and-add tree in the vector's 128-bit lanes.
__attribute__((always_inline)) inline void AddLaneSums(const simd::F32x8x2* P, int64_t N,
                                                       float* row) {
  const int64_t full = N / 8 * 8;
  for (int64_t n = 0; n < full; n += 8) {
    const simd::F32x8x2 s = simd::F32x8x2::SumHalves8(P + n);
    ((simd::F32x8::Load(row + n) + s.Half(0)) + s.Half(1)).Store(row + n);
  }
  for (int64_t n = full; n < N; ++n) row[n] = (row[n] + P[n].Half(0).Sum()) + P[n].Half(1).Sum();
}
#endif

template <class VT, int kN, bool kWithY>
void ForwardBlock(const ScanInputs<typename VT::Scalar>& in, int64_t i0, int64_t rows,
                  const typename VT::Scalar* h0, const typename VT::Scalar* d_skip,
                  typename VT::Scalar* h_end, typename VT::Scalar* y) {
  using T = typename VT::Scalar;
  const int64_t N = kN ? kN : in.N, Di = in.Di;
  Buf<VT, kN> Ac(2, N);  // DecayCoef(A[i0 + c, n])
  Buf<VT, kN> h(3, N);   // the running state
  for (int64_t n = 0; n < N; ++n) {
    Ac[n] = VT::DecayCoef(Gather<VT>(in.A + i0 * N + n, N));
    h[n] = h0 ? Gather<VT>(h0 + i0 * N + n, N) : VT::Set(T(0));
  }
  const VT dskip = VT::Load(d_skip + i0);
  const VT* cols = PackColumns<VT>(rows, Di, i0, in.dt, in.xc);  // (rows, 2): Delta, x'
  const NextColumns<VT> next(Di, i0, in.dt, in.xc);
  for (int64_t t = 0; t < rows; ++t) {
    next.Fetch(t);
    const VT dt = cols[2 * t], x = cols[2 * t + 1];
    const VT dtx = dt * x;
    const T* B = in.B + t * in.bc_stride;
    const T* C = in.C + t * in.bc_stride;
    VT acc = VT::Set(T(0));
#pragma GCC unroll 16
    for (int64_t n = 0; n < N; ++n) {
      h[n] = VT::Fma(VT::Decay(dt, Ac[n]), h[n], dtx * VT::Set(B[n]));
      if constexpr (kWithY) acc = VT::Fma(h[n], VT::Set(C[n]), acc);
    }
    if constexpr (kWithY) VT::Fma(dskip, x, acc).Store(y + t * Di + i0);
  }
  for (int64_t n = 0; n < N; ++n) Scatter(h[n], h_end + i0 * N + n, N);
}

template <class VT, int kN>
void AdjointSummaryBlock(const ScanInputs<typename VT::Scalar>& in, int64_t i0, int64_t len,
                         const typename VT::Scalar* ybar, typename VT::Scalar* m) {
  using T = typename VT::Scalar;
  const int64_t N = kN ? kN : in.N, Di = in.Di;
  Buf<VT, kN> Ac(2, N);     // DecayCoef(A)
  Buf<VT, kN> carry(3, N);  // carry_t = a_t . lambda_t, flowing into row t - 1
  for (int64_t n = 0; n < N; ++n) {
    Ac[n] = VT::DecayCoef(Gather<VT>(in.A + i0 * N + n, N));
    carry[n] = VT::Set(T(0));
  }
  const VT* cols = PackColumns<VT>(len, Di, i0, in.dt, ybar);  // (len, 2): Delta, ybar
  const NextColumns<VT> next(Di, i0, in.dt, ybar);
  for (int64_t t = len - 1; t >= 0; --t) {
    next.Fetch(t);
    const VT dt = cols[2 * t], yb = cols[2 * t + 1];
    const T* C = in.C + t * in.bc_stride;
#pragma GCC unroll 16
    for (int64_t n = 0; n < N; ++n)
      carry[n] = VT::Decay(dt, Ac[n]) * VT::Fma(yb, VT::Set(C[n]), carry[n]);
  }
  for (int64_t n = 0; n < N; ++n) Scatter(carry[n], m + i0 * N + n, N);
}

// The exact backward of one block, one group of G states at a time: pass 1 recomputes a_t and
// h_t of the group's states forward (kept: (len, G) and (len + 1, G) vectors) and goes on with
// y_t's sum over the states; pass 2 runs lambda in reverse, lambda_t = ybar_t C_t +
// carry_{t+1} with carry_t = a_t . lambda_t (the adjoint summary's recurrence, so mu_out with
// mu = 0 is that summary's m bit for bit), and at each row the per-token VJPs of scan.h step 3.
//
// With 8- or 16-lane vectors and N = 16 G = 8. Pass 2's carry, dA and A are then 24 vectors,
// not 48: AVX2's 16 registers hold the 16 of carry and dA, AVX-512's 32 hold all 24, where one
// group of 16 spilled (kernel_bench's scan_backward is faster: docs/BENCHMARKS.md). And the rows
// a group keeps are half as many bytes (256 KiB at 256 rows on AVX-512, not 512), so they stay
// in L2 between its passes. The sums that run over all states, y_t's, s_a and s_b of a row, go
// on from one group to the next through `sums`, adding the same terms in the same state order,
// so the bits are one group's; dB and dC of a row are written per state. G is a multiple of the
// 8 states AddLaneSums transposes at once.
template <class VT, int kN>
void BackwardBlock(const ScanInputs<typename VT::Scalar>& in, int64_t i0, int64_t len,
                   const typename VT::Scalar* h0, const typename VT::Scalar* mu,
                   const typename VT::Scalar* ybar, const typename VT::Scalar* d_skip,
                   const ScanGrads<typename VT::Scalar>& out) {
  using T = typename VT::Scalar;
  const int64_t N = kN ? kN : in.N, Di = in.Di;
  constexpr int64_t kG = (kN == 16 && VT::kLanes >= 8) ? 8 : kN;
  const int64_t G = kG ? kG : N;
  Buf<VT, kN> At(2, N), Ac(3, N);      // A and DecayCoef(A)
  Buf<VT, kN> carry(4, N);             // a_t . lambda_t, flowing into row t - 1
  Buf<VT, kN> dA(5, N);                // dL/dA, accumulated over the rows
  Buf<VT, kN> P(6, N);                 // lambda_t Delta_t x'_t: this row's dB terms
  Buf<VT, kN> Q(7, N);                 // ybar_t h_t: this row's dC terms
  VT* a = Work<VT>(0, len * G);        // (len, G) a_t of the group's states
  VT* H = Work<VT>(1, (len + 1) * G);  // (len + 1, G) H[t + 1] = h_t, H[0] = h0
  VT* sums = G < N ? Work<VT>(8, 3 * len) : nullptr;  // (len, 3): y_t's sum, s_a, s_b of row t
  VT* outs = Work<VT>(10, 3 * len);    // (len, 3): row t's y, dDelta and dx'
  for (int64_t n = 0; n < N; ++n) {
    At[n] = Gather<VT>(in.A + i0 * N + n, N);
    Ac[n] = VT::DecayCoef(At[n]);
    dA[n] = Gather<VT>(out.dA + i0 * N + n, N);
  }
  const VT dskip = VT::Load(d_skip + i0);
  const VT* cols = PackColumns<VT>(len, Di, i0, in.dt, in.xc, ybar);  // (len, 3): Delta, x', ybar
  const NextColumns<VT> next(Di, i0, in.dt, in.xc, ybar);
#pragma GCC unroll 2
  for (int64_t n0 = 0; n0 < N; n0 += G) {
    const bool first_group = n0 == 0, last_group = n0 + G >= N;
    // Pass 1 over the group's states.
    for (int64_t n = 0; n < G; ++n)
      H[n] = h0 ? Gather<VT>(h0 + i0 * N + n0 + n, N) : VT::Set(T(0));
    VT dD = VT::Set(T(0));
    for (int64_t t = 0; t < len; ++t) {
      if (last_group) next.Fetch(t);
      const VT dt = cols[3 * t], x = cols[3 * t + 1];
      const VT dtx = dt * x;
      const T* B = in.B + t * in.bc_stride + n0;
      const T* C = in.C + t * in.bc_stride + n0;
      const VT* hp = H + t * G;
      VT* hn = H + (t + 1) * G;
      VT* at = a + t * G;
      VT acc = first_group ? VT::Set(T(0)) : sums[3 * t];
#pragma GCC unroll 16
      for (int64_t n = 0; n < G; ++n) {
        at[n] = VT::Decay(dt, Ac[n0 + n]);
        hn[n] = VT::Fma(at[n], hp[n], dtx * VT::Set(B[n]));
        acc = VT::Fma(hn[n], VT::Set(C[n]), acc);
      }
      if (last_group) {
        outs[3 * t] = VT::Fma(dskip, x, acc);
      } else {
        sums[3 * t] = acc;
      }
      if (first_group) dD = VT::Fma(cols[3 * t + 2], x, dD);
    }
    if (first_group) (VT::Load(out.dD + i0) + dD).Store(out.dD + i0);

    // Pass 2 over the group's states, rows in reverse. kLast: the chunk's last row, where lambda
    // starts from mu.
    auto row = [&](int64_t t, auto last) {
      const VT dt = cols[3 * t], x = cols[3 * t + 1];
      const VT yb = cols[3 * t + 2], dtx = dt * x;
      const T* B = in.B + t * in.bc_stride;
      const T* C = in.C + t * in.bc_stride;
      const VT* hp = H + t * G - n0;  // indexed by the state n
      const VT* hn = H + (t + 1) * G - n0;
      const VT* at = a + t * G - n0;
      VT s_a = first_group ? VT::Set(T(0)) : sums[3 * t + 1];
      VT s_b = first_group ? VT::Set(T(0)) : sums[3 * t + 2];
#pragma GCC unroll 16
      for (int64_t n = n0; n < n0 + G; ++n) {
        // carry[n] holds a_{t+1} . lambda_{t+1} (mu at the last row), as in AdjointSummaryBlock.
        if constexpr (decltype(last)::value)
          carry[n] = mu ? Gather<VT>(mu + i0 * N + n, N) : VT::Set(T(0));
        const VT lam = VT::Fma(yb, VT::Set(C[n]), carry[n]);
        carry[n] = at[n] * lam;
        const VT ga = carry[n] * hp[n];  // dL/d(Delta_t A[i, n]) = lambda_t . a_t . h_{t-1}
        dA[n] = VT::Fma(ga, dt, dA[n]);
        s_a = VT::Fma(ga, At[n], s_a);
        s_b = VT::Fma(lam, VT::Set(B[n]), s_b);
        P[n] = lam * dtx;
        Q[n] = yb * hn[n];
      }
      if (last_group) {
        // This row's output lines, owned before the sweep below writes them.
        __builtin_prefetch(out.y + t * Di + i0, 1, 2);
        __builtin_prefetch(out.ddt + t * Di + i0, 1, 2);
        __builtin_prefetch(out.dxc + t * Di + i0, 1, 2);
        outs[3 * t + 1] = VT::Fma(x, s_b, s_a);
        outs[3 * t + 2] = VT::Fma(dt, s_b, dskip * yb);
      } else {
        sums[3 * t + 1] = s_a, sums[3 * t + 2] = s_b;
      }
      AddLaneSums(&P[n0], G, out.dB + t * N + n0);
      AddLaneSums(&Q[n0], G, out.dC + t * N + n0);
    };
    row(len - 1, std::true_type{});
    for (int64_t t = len - 2; t >= 0; --t) row(t, std::false_type{});
  }
  // The outputs' rows are Di apart, as the inputs' are (PackColumns): inside a gradient a store
  // per row and array in the passes reached a cold line in the same few L1 sets each time.
  // Gathered here and written in one sweep after the last group, this kernel takes less of a
  // gradient's time, though kernel_bench's scan_backward, whose outputs stay in L2 between
  // calls, runs slower (docs/BENCHMARKS.md). (The forward's y, gathered the same way, went the
  // other way inside the gradient, and is stored per row.) The values are the same.
  for (int64_t t = 0; t < len; ++t) {
    outs[3 * t].Store(out.y + t * Di + i0);
    outs[3 * t + 1].Store(out.ddt + t * Di + i0);
    outs[3 * t + 2].Store(out.dxc + t * Di + i0);
  }
  for (int64_t n = 0; n < N; ++n) {
    Scatter(dA[n], out.dA + i0 * N + n, N);
    if (out.mu_out) Scatter(carry[n], out.mu_out + i0 * N + n, N);
  }
}

// Every channel: full blocks in the wide type (simd::Wide: two blocks of VT at a time where
// AVX-512 is), then blocks of VT, then the rest one by one. Each channel computes the same in all
// three, and the blocks reach dB and dC in channel order, so the split changes no bit.
template <class VT, class Fn>
void ForEachBlock(int64_t Di, Fn fn) {
  using W = simd::Wide<VT>;
  using One = simd::Lanes<typename VT::Scalar, 1>;
  int64_t i0 = 0;
  if constexpr (!std::is_same_v<W, VT>)
    for (; i0 + W::kLanes <= Di; i0 += W::kLanes) fn(W{}, i0);
  for (; i0 + VT::kLanes <= Di; i0 += VT::kLanes) fn(VT{}, i0);
  for (; i0 < Di; ++i0) fn(One{}, i0);
}

template <class VT, int kN, bool kWithY>
void ForwardAll(const ScanInputs<typename VT::Scalar>& in, int64_t rows,
                const typename VT::Scalar* h0, const typename VT::Scalar* d_skip,
                typename VT::Scalar* h_end, typename VT::Scalar* y) {
  ForEachBlock<VT>(in.Di, [&](auto v, int64_t i0) {
    ForwardBlock<decltype(v), kN, kWithY>(in, i0, rows, h0, d_skip, h_end, y);
  });
}

template <class VT, int kN>
void AdjointSummaryAll(const ScanInputs<typename VT::Scalar>& in, int64_t len,
                       const typename VT::Scalar* ybar, typename VT::Scalar* m) {
  ForEachBlock<VT>(in.Di, [&](auto v, int64_t i0) {
    AdjointSummaryBlock<decltype(v), kN>(in, i0, len, ybar, m);
  });
}

template <class VT, int kN>
void BackwardAll(const ScanInputs<typename VT::Scalar>& in, int64_t len,
                 const typename VT::Scalar* h0, const typename VT::Scalar* mu,
                 const typename VT::Scalar* ybar, const typename VT::Scalar* d_skip,
                 const ScanGrads<typename VT::Scalar>& out) {
  ForEachBlock<VT>(in.Di, [&](auto v, int64_t i0) {
    BackwardBlock<decltype(v), kN>(in, i0, len, h0, mu, ybar, d_skip, out);
  });
}

// The entry points of scan_block.h for vector type VT (kN dispatched here).
template <class VT>
void Forward(const ScanInputs<typename VT::Scalar>& in, int64_t rows, const typename VT::Scalar* h0,
             const typename VT::Scalar* d_skip, typename VT::Scalar* h_end,
             typename VT::Scalar* y) {
  if (in.N == 16) {
    if (y) return ForwardAll<VT, 16, true>(in, rows, h0, d_skip, h_end, y);
    return ForwardAll<VT, 16, false>(in, rows, h0, d_skip, h_end, y);
  }
  if (y) return ForwardAll<VT, 0, true>(in, rows, h0, d_skip, h_end, y);
  ForwardAll<VT, 0, false>(in, rows, h0, d_skip, h_end, y);
}

template <class VT>
void AdjointSummary(const ScanInputs<typename VT::Scalar>& in, int64_t len,
                    const typename VT::Scalar* ybar, typename VT::Scalar* m) {
  if (in.N == 16) return AdjointSummaryAll<VT, 16>(in, len, ybar, m);
  AdjointSummaryAll<VT, 0>(in, len, ybar, m);
}

template <class VT>
void Backward(const ScanInputs<typename VT::Scalar>& in, const ScanBackwardOptions& opt,
              const typename VT::Scalar* h0, const typename VT::Scalar* mu,
              const typename VT::Scalar* ybar, const typename VT::Scalar* d_skip,
              const ScanGrads<typename VT::Scalar>& out) {
  using T = typename VT::Scalar;
  if (opt.window > 0) {  // the truncated adjoint: scan.h's per-channel kernel
    thread_local ScanScratch<T> scratch;
    ScanGrads<T> g = out;
    g.mu_out = nullptr;
    for (int64_t i = 0; i < in.Di; ++i)
      ScanBackwardChannel<T>(in, i, opt, h0 ? h0 + i * in.N : nullptr, mu ? mu + i * in.N : nullptr,
                             ybar, d_skip[i], scratch, g);
    return;
  }
  if (in.N == 16) return BackwardAll<VT, 16>(in, opt.len, h0, mu, ybar, d_skip, out);
  BackwardAll<VT, 0>(in, opt.len, h0, mu, ybar, d_skip, out);
}

}  // namespace adjsh::cpu::blocked

#endif  // ADJSH_KERNELS_CPU_SCAN_BLOCK_IMPL_H_
