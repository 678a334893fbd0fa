// What the CUDA Mamba-2 layer's tests share (tests/cuda/mamba2_emulation_test.cc runs the
// device code on the host, tests/cuda/mamba2_cuda_test.cc on a GPU): the shapes, random
// weights and chunk inputs, every output of the CPU layer (kernels/cpu/mamba2_layer.h) in f64 and of
// the device layer (kernels/cuda/mamba2_block.h) in f32, and their relative error. Include
// after the device code (the emulation's, or the GPU build's header).
#ifndef ADJSH_TESTS_CUDA_MAMBA2_CHECK_H_
#define ADJSH_TESTS_CUDA_MAMBA2_CHECK_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/mamba2_layer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/mamba2_block.h"

namespace adjsh::testing {

// D hidden (Di = 2 D), G groups, P head_dim (H = Di / P); dt clamped to [0.01, 0.08] or not.
struct Shape {
  int64_t D, G, P;
  bool clamped;
};
// How gtest names a Shape parameter (its default prints the struct's bytes, padding included).
inline void PrintTo(const Shape& s, std::ostream* os) {
  *os << "D " << s.D << ", G " << s.G << ", P " << s.P << (s.clamped ? ", dt clamped" : "");
}

// The test name of a Shape parameter: "D16_G2_P4" (snprintf: string concatenation here meets
// a GCC 12 -Wrestrict false positive).
inline std::string ShapeName(const ::testing::TestParamInfo<Shape>& info) {
  char name[48];
  std::snprintf(name, sizeof(name), "D%lld_G%lld_P%lld", static_cast<long long>(info.param.D),
                static_cast<long long>(info.param.G), static_cast<long long>(info.param.P));
  return name;
}

inline Mamba2Config ConfigOf(const Shape& s) {
  Mamba2Config c;
  c.hidden_size = s.D, c.expand = 2, c.state_size = 8, c.conv_kernel = 4;
  c.head_dim = s.P, c.num_heads = 2 * s.D / s.P, c.n_groups = s.G, c.num_hidden_layers = 1;
  if (s.clamped) c.time_step_min_limit = 0.01, c.time_step_max_limit = 0.08;
  return c;
}

inline std::vector<float> Random(int64_t n, std::mt19937_64& rng, float mean, float spread) {
  std::normal_distribution<float> d(mean, spread);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <typename T>
std::vector<T> Widen(const std::vector<float>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// Random weights in f32, the f64 layer holding the same values.
inline Mamba2Layer<float> RandomLayer(const Mamba2Config& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Mamba2Dims d(c);
  Mamba2Layer<float> l;
  l.norm = Random(d.D, rng, 1, 0.2f);
  l.in_proj = Random(d.Dp * d.D, rng, 0, 0.25f);
  l.conv_w = Random(d.Cc * d.W, rng, 0, 0.4f);
  l.conv_b = Random(d.Cc, rng, 0, 0.3f);
  l.dt_bias = Random(d.H, rng, -3, 0.5f);  // softplus(dt_bias) ~ 0.05: dt across the clamp
  std::uniform_real_distribution<float> a(1, 16);
  l.A_log.resize(d.H);
  for (float& x : l.A_log) x = std::log(a(rng));
  l.D = Random(d.H, rng, 1, 0.3f);
  l.gnorm = Random(d.Di, rng, 1, 0.2f);
  l.out_proj = Random(d.D * d.Di, rng, 0, 0.2f);
  return l;
}

template <typename T>
Mamba2Layer<T> Convert(const Mamba2Layer<float>& l) {
  return {Widen<T>(l.norm),    Widen<T>(l.in_proj), Widen<T>(l.conv_w),
          Widen<T>(l.conv_b),  Widen<T>(l.dt_bias), Widen<T>(l.A_log),
          Widen<T>(l.D),       Widen<T>(l.gnorm),   Widen<T>(l.out_proj)};
}

template <typename T>
Mamba2Layer<T> ZeroLike(const Mamba2Layer<float>& l) {
  Mamba2Layer<T> z = Convert<T>(l);
  for (std::vector<T>* v : {&z.norm, &z.in_proj, &z.conv_w, &z.conv_b, &z.dt_bias, &z.A_log,
                            &z.D, &z.gnorm, &z.out_proj})
    std::fill(v->begin(), v->end(), T(0));
  return z;
}

// Every output of one chunk's calls, by name, in the type of the implementation.
template <typename T>
struct Outputs {
  std::vector<std::string> names;
  std::vector<std::vector<T>> values;
  void Add(const std::string& name, const std::vector<T>& v) {
    names.push_back(name);
    values.push_back(v);
  }
  void AddGrad(const std::string& prefix, const Mamba2Layer<T>& g, bool halo_only) {
    Add(prefix + "norm", g.norm);
    Add(prefix + "in_proj", g.in_proj);
    if (halo_only) return;
    Add(prefix + "conv_w", g.conv_w), Add(prefix + "conv_b", g.conv_b);
    Add(prefix + "dt_bias", g.dt_bias), Add(prefix + "A_log", g.A_log), Add(prefix + "D", g.D);
    Add(prefix + "gnorm", g.gnorm), Add(prefix + "out_proj", g.out_proj);
  }
};

// The chunk's inputs: u rows [t0 - hb, t1), S0, dout, the incoming carry and halo, and the
// halo backward's incoming du (n = hb rows).
struct Inputs {
  int64_t t0, t1, hb;
  std::vector<float> u, S0, dout, carry, halo, du_halo;
};

inline Inputs RandomInputs(const Mamba2Config& c, int64_t t0, int64_t L, uint64_t seed) {
  const Mamba2Dims d(c);
  std::mt19937_64 rng(seed);
  Inputs in;
  in.t0 = t0, in.t1 = t0 + L, in.hb = std::min(d.W - 1, t0);
  in.u = Random((in.hb + L) * d.D, rng, 0, 1);
  in.S0 = Random(d.H * d.P * d.N, rng, 0, 0.5f);
  in.dout = Random(L * d.D, rng, 0, 1);
  in.carry = Random(d.H * d.P * d.N, rng, 0, 0.5f);
  in.halo = Random((d.W - 1) * d.Cc, rng, 0, 0.5f);
  in.du_halo = Random(in.hb * d.D, rng, 0, 1);
  return in;
}

// The CPU layer in f64.
inline Outputs<double> RunCpu(const Mamba2Config& c, const Mamba2Layer<float>& w,
                              const Inputs& in) {
  const Mamba2Dims d(c);
  const Mamba2Layer<double> l = Convert<double>(w);
  const int64_t L = in.t1 - in.t0;
  const std::vector<double> u = Widen<double>(in.u), dout = Widen<double>(in.dout);
  Outputs<double> o;
  Mamba2ChunkActs<double> a, a_states;
  std::vector<double> S = Widen<double>(in.S0), S_only = S, out(L * d.D);
  Mamba2ChunkForward(l, c, u.data(), in.t0, in.t1, S.data(), a, out.data());
  Mamba2ChunkForward(l, c, u.data(), in.t0, in.t1, S_only.data(), a_states,
                     static_cast<double*>(nullptr));
  o.Add("out", out), o.Add("S", S), o.Add("S (states only)", S_only);
  std::vector<double> carry_adj = Widen<double>(in.carry);
  Mamba2ChunkAdjoint(l, c, a, dout.data(), carry_adj.data());
  o.Add("adjoint carry", carry_adj);
  std::vector<double> carry = Widen<double>(in.carry), halo = Widen<double>(in.halo), du(L * d.D);
  Mamba2Layer<double> g = ZeroLike<double>(w);
  Mamba2ChunkBackward(l, c, u.data(), a, dout.data(), carry.data(), halo.data(), g, du.data());
  o.Add("du", du), o.Add("carry", carry), o.Add("halo", halo);
  o.AddGrad("grad ", g, false);
  if (in.hb > 0) {
    Mamba2Layer<double> gh = ZeroLike<double>(w);
    std::vector<double> du_h = Widen<double>(in.du_halo);
    Mamba2HaloBackward(l, c, u.data(), in.t0, halo.data(), gh, du_h.data());
    o.Add("halo du", du_h);
    o.AddGrad("halo grad ", gh, true);
  }
  return o;
}

// The device layer; each backward runs `calls` times into the same accumulators (the
// incoming carry and halo the same each time); defer: the sums kept on the device across the
// calls (defer_grad) and brought down by FinishBackward.
inline Outputs<float> RunDevice(const Mamba2Config& c, const Mamba2Layer<float>& w,
                                const Inputs& in, int calls = 1, bool defer = false) {
  const Mamba2Dims d(c);
  const int64_t L = in.t1 - in.t0;
  cuda::DeviceMamba2Block block(0, cuda::Mamba2ShapeOf(c), cuda::Mamba2TensorsOf<const float>(w));
  Outputs<float> o;
  std::vector<float> S = in.S0, S_only = in.S0, out(L * d.D);
  block.Forward(in.u.data(), in.t0, in.t1, S.data(), out.data());
  block.Forward(in.u.data(), in.t0, in.t1, S_only.data(), nullptr);
  o.Add("out", out), o.Add("S", S), o.Add("S (states only)", S_only);
  std::vector<float> carry_adj = in.carry;
  block.Adjoint(in.u.data(), in.t0, in.t1, in.S0.data(), in.dout.data(), carry_adj.data());
  o.Add("adjoint carry", carry_adj);
  Mamba2Layer<float> g = ZeroLike<float>(w);
  std::vector<float> carry, halo, du(L * d.D);
  for (int k = 0; k < calls; ++k) {
    carry = in.carry, halo = in.halo;
    block.Backward(in.u.data(), in.t0, in.t1, in.S0.data(), in.dout.data(), carry.data(),
                   halo.data(), cuda::Mamba2TensorsOf<float>(g), du.data(), defer);
  }
  if (defer) block.FinishBackward(cuda::Mamba2TensorsOf<float>(g));
  o.Add("du", du), o.Add("carry", carry), o.Add("halo", halo);
  o.AddGrad("grad ", g, false);
  if (in.hb > 0) {
    Mamba2Layer<float> gh = ZeroLike<float>(w);
    std::vector<float> du_h = in.du_halo;
    for (int k = 0; k < calls; ++k)
      block.HaloBackward(in.u.data(), in.t0, halo.data(), cuda::Mamba2TensorsOf<float>(gh),
                         du_h.data(), defer);
    if (defer) block.FinishBackward(cuda::Mamba2TensorsOf<float>(gh));
    o.Add("halo du", du_h);
    o.AddGrad("halo grad ", gh, true);
  }
  return o;
}

// ||a - b|| / ||b|| (||a - b|| where b is zero).
inline double Mamba2RelErr(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    num += (double(a[k]) - b[k]) * (double(a[k]) - b[k]);
    den += b[k] * b[k];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace adjsh::testing

#endif  // ADJSH_TESTS_CUDA_MAMBA2_CHECK_H_
