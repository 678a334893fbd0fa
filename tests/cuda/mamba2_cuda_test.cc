// The CUDA Mamba-2 layer (kernels/cuda/mamba2_block.h) on a GPU against the CPU layer
// (engine/mamba2_layer.h) in f64 from the same weights, at the shapes of
// tests/cuda/mamba2_emulation_test.cc (which runs the same device code on the host): D 16 with
// G in {1, 2} x head_dim in {4, 16} (dt clamped with G = 2), and D 160, head_dim 64 (the
// kernels' strided loops); chunks at t0 in {0, 2, 9} with L in {1, 7, 70}: every output of
// Forward, Adjoint, Backward and HaloBackward and every parameter gradient within 1e-5
// relative; and a repeated call gives the same bits. Every test skips where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "engine/mamba2_layer.h"
#include "kernels/cuda/device_block.h"
#include "kernels/cuda/mamba2_block.h"

namespace adjsh {
namespace {

// f32 against f64: each operation rounds at 6e-8 relative and no sum at these shapes has more
// than several hundred terms, so each tensor's ||a - b|| / ||b|| stays near 1e-6 unless a term
// is wrong (the emulation test reports the worst per tensor).
constexpr double kTol = 1e-5;

// D hidden (Di = 2 D), G groups, P head_dim (H = Di / P); dt clamped to [0.01, 0.08] or not.
struct Shape {
  int64_t D, G, P;
  bool clamped;
};
// How gtest names a Shape parameter (its default prints the struct's bytes, padding included).
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "D " << s.D << ", G " << s.G << ", P " << s.P << (s.clamped ? ", dt clamped" : "");
}

Mamba2Config ConfigOf(const Shape& s) {
  Mamba2Config c;
  c.hidden_size = s.D, c.expand = 2, c.state_size = 8, c.conv_kernel = 4;
  c.head_dim = s.P, c.num_heads = 2 * s.D / s.P, c.n_groups = s.G, c.num_hidden_layers = 1;
  if (s.clamped) c.time_step_min_limit = 0.01, c.time_step_max_limit = 0.08;
  return c;
}

std::vector<float> Random(int64_t n, std::mt19937_64& rng, float mean, float spread) {
  std::normal_distribution<float> d(mean, spread);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <typename T>
std::vector<T> Widen(const std::vector<float>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <typename T>
std::vector<std::vector<T>*> Members(Mamba2Layer<T>& l) {
  return {&l.norm, &l.in_proj, &l.conv_w, &l.conv_b, &l.dt_bias,
          &l.A_log, &l.D,      &l.gnorm,  &l.out_proj};
}
const char* const kGradNames[] = {"norm",  "in_proj", "conv_w", "conv_b",  "dt_bias",
                                  "A_log", "D",       "gnorm",  "out_proj"};

Mamba2Layer<float> RandomLayer(const Mamba2Config& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Mamba2Dims d(c);
  Mamba2Layer<float> l;
  l.norm = Random(d.D, rng, 1, 0.2f);
  l.in_proj = Random(d.Dp * d.D, rng, 0, 0.25f);
  l.conv_w = Random(d.Cc * d.W, rng, 0, 0.4f);
  l.conv_b = Random(d.Cc, rng, 0, 0.3f);
  l.dt_bias = Random(d.H, rng, -3, 0.5f);
  std::uniform_real_distribution<float> a(1, 16);
  l.A_log.resize(d.H);
  for (float& x : l.A_log) x = std::log(a(rng));
  l.D = Random(d.H, rng, 1, 0.3f);
  l.gnorm = Random(d.Di, rng, 1, 0.2f);
  l.out_proj = Random(d.D * d.Di, rng, 0, 0.2f);
  return l;
}

template <typename T>
Mamba2Layer<T> Convert(Mamba2Layer<float> l, bool zero) {
  Mamba2Layer<T> out;
  const std::vector<std::vector<float>*> src = Members(l);
  const std::vector<std::vector<T>*> dst = Members(out);
  for (size_t q = 0; q < src.size(); ++q)
    *dst[q] = zero ? std::vector<T>(src[q]->size(), T(0)) : Widen<T>(*src[q]);
  return out;
}

// One chunk's outputs by name.
template <typename T>
struct Outputs {
  std::vector<std::string> names;
  std::vector<std::vector<T>> values;
  void Add(const std::string& name, const std::vector<T>& v) {
    names.push_back(name);
    values.push_back(v);
  }
  void AddGrad(const std::string& prefix, Mamba2Layer<T>& g, size_t count) {
    const std::vector<std::vector<T>*> m = Members(g);
    for (size_t q = 0; q < count; ++q) Add(prefix + kGradNames[q], *m[q]);
  }
};

struct Inputs {
  int64_t t0, t1, hb;
  std::vector<float> u, S0, dout, carry, halo, du_halo;
};

Inputs RandomInputs(const Mamba2Config& c, int64_t t0, int64_t L, uint64_t seed) {
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

Outputs<double> RunCpu(const Mamba2Config& c, const Mamba2Layer<float>& w, const Inputs& in) {
  const Mamba2Dims d(c);
  const Mamba2Layer<double> l = Convert<double>(w, false);
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
  Mamba2Layer<double> g = Convert<double>(w, true);
  Mamba2ChunkBackward(l, c, u.data(), a, dout.data(), carry.data(), halo.data(), g, du.data());
  o.Add("du", du), o.Add("carry", carry), o.Add("halo", halo);
  o.AddGrad("grad ", g, 9);
  if (in.hb > 0) {
    Mamba2Layer<double> gh = Convert<double>(w, true);
    std::vector<double> du_h = Widen<double>(in.du_halo);
    Mamba2HaloBackward(l, c, u.data(), in.t0, halo.data(), gh, du_h.data());
    o.Add("halo du", du_h);
    o.AddGrad("halo grad ", gh, 2);
  }
  return o;
}

Outputs<float> RunDevice(const Mamba2Config& c, const Mamba2Layer<float>& w, const Inputs& in) {
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
  Mamba2Layer<float> g = Convert<float>(w, true);
  std::vector<float> carry = in.carry, halo = in.halo, du(L * d.D);
  block.Backward(in.u.data(), in.t0, in.t1, in.S0.data(), in.dout.data(), carry.data(),
                 halo.data(), cuda::Mamba2TensorsOf<float>(g), du.data());
  o.Add("du", du), o.Add("carry", carry), o.Add("halo", halo);
  o.AddGrad("grad ", g, 9);
  if (in.hb > 0) {
    Mamba2Layer<float> gh = Convert<float>(w, true);
    std::vector<float> du_h = in.du_halo;
    block.HaloBackward(in.u.data(), in.t0, halo.data(), cuda::Mamba2TensorsOf<float>(gh),
                       du_h.data());
    o.Add("halo du", du_h);
    o.AddGrad("halo grad ", gh, 2);
  }
  return o;
}

double RelErr(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    num += (double(a[k]) - b[k]) * (double(a[k]) - b[k]);
    den += b[k] * b[k];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

class Mamba2CudaTest : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    std::string error;
    if (cuda::DeviceCount(&error) == 0) GTEST_SKIP() << "no CUDA device: " << error;
  }
};

TEST_P(Mamba2CudaTest, MatchesCpuF64) {
  const Mamba2Config c = ConfigOf(GetParam());
  const Shape& s = GetParam();
  const Mamba2Layer<float> w = RandomLayer(c, 7 + s.D + s.G * 16 + s.P);
  for (int64_t t0 : {0, 2, 9}) {
    for (int64_t L : {1, 7, 70}) {
      const Inputs in = RandomInputs(c, t0, L, 100 * t0 + L);
      const Outputs<double> want = RunCpu(c, w, in);
      const Outputs<float> got = RunDevice(c, w, in);
      ASSERT_EQ(got.names, want.names);
      for (size_t q = 0; q < want.names.size(); ++q) {
        const double e = RelErr(got.values[q], want.values[q]);
        EXPECT_LT(e, kTol) << want.names[q] << " at t0 " << t0 << ", L " << L;
      }
    }
  }
}

TEST_P(Mamba2CudaTest, RepeatsBitwise) {
  const Mamba2Config c = ConfigOf(GetParam());
  const Mamba2Layer<float> w = RandomLayer(c, 3);
  const Inputs in = RandomInputs(c, 9, 70, 5);
  const Outputs<float> a = RunDevice(c, w, in), b = RunDevice(c, w, in);
  for (size_t q = 0; q < a.names.size(); ++q) {
    ASSERT_EQ(a.values[q].size(), b.values[q].size());
    EXPECT_EQ(std::memcmp(a.values[q].data(), b.values[q].data(),
                          a.values[q].size() * sizeof(float)),
              0)
        << a.names[q];
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Mamba2CudaTest,
                         ::testing::Values(Shape{16, 1, 4, false}, Shape{16, 1, 16, false},
                                           Shape{16, 2, 4, true}, Shape{16, 2, 16, true},
                                           Shape{160, 1, 64, true}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           char name[48];
                           std::snprintf(name, sizeof(name), "D%lld_G%lld_P%lld",
                                         static_cast<long long>(info.param.D),
                                         static_cast<long long>(info.param.G),
                                         static_cast<long long>(info.param.P));
                           return std::string(name);
                         });

}  // namespace
}  // namespace adjsh
