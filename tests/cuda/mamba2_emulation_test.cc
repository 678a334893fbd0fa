// The CUDA Mamba-2 layer (kernels/cuda/mamba2_block.cu with mamba2_kernels.cuh) compiled for
// the host: kernels run block by block on host threads (host_emulation.h), device memory is
// host memory, cuBLAS is a plain f32 GEMM over the same row-major operands (emulated_device.h,
// which also brings the Mamba-1 block's code: the names do not meet). Checked against the CPU
// layer (engine/mamba2_layer.h) in f64 from the same weights: Forward (with and without out),
// Adjoint, Backward and HaloBackward, every output and every parameter gradient, over
// G in {1, 2} x head_dim in {4, 16} (N 8, W 4, D 16, Di 32), chunks at t0 = 0 (no halo) and
// t0 = 9 (a full halo of W - 1 rows) with L in {1, 7, 70} (70: two blocks of the scan
// backward's recomputed states), and t0 = 2, L = 7 (a halo cut by the sequence's start); dt
// clamped in the G = 2 shapes; and one wider shape whose kernel loops stride (D 160, P 64).
// Also: a repeated call gives the same bits, and gradients accumulate (grad + grad, bitwise).
// About 20 s on an idle machine: each emulated CUDA thread is a host thread.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/cuda/emulated_device.h"
// The Mamba-2 device code after the emulation macros.
#include "kernels/cuda/mamba2_block.cu"
#include "engine/mamba2_layer.h"

namespace adjsh {
namespace {

using ::adjsh::testing::RelErr;

// f32 against f64: each operation rounds at 6e-8 relative, and at these shapes no sum has more
// than several hundred terms (the scan: 70 rows; GEMMs: Dp = 661 at most), so a tensor's
// relative error (||a - b|| / ||b||) stays near 1e-6 unless a term is wrong or missing; the
// worst seen is printed per tensor.
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

// Random weights in f32, the f64 layer holding the same values.
Mamba2Layer<float> RandomLayer(const Mamba2Config& c, uint64_t seed) {
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

// The CPU layer in f64.
Outputs<double> RunCpu(const Mamba2Config& c, const Mamba2Layer<float>& w, const Inputs& in) {
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
// incoming carry and halo the same each time).
Outputs<float> RunDevice(const Mamba2Config& c, const Mamba2Layer<float>& w, const Inputs& in,
                         int calls) {
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
                   halo.data(), cuda::Mamba2TensorsOf<float>(g), du.data());
  }
  o.Add("du", du), o.Add("carry", carry), o.Add("halo", halo);
  o.AddGrad("grad ", g, false);
  if (in.hb > 0) {
    Mamba2Layer<float> gh = ZeroLike<float>(w);
    std::vector<float> du_h = in.du_halo;
    for (int k = 0; k < calls; ++k)
      block.HaloBackward(in.u.data(), in.t0, halo.data(), cuda::Mamba2TensorsOf<float>(gh),
                         du_h.data());
    o.Add("halo du", du_h);
    o.AddGrad("halo grad ", gh, true);
  }
  return o;
}

// Every output of the chunks (t0, L) within kTol of the f64 CPU layer; prints the worst
// relative error per tensor.
void ExpectMatchesCpu(const Shape& s, const std::vector<std::pair<int64_t, int64_t>>& chunks) {
  // Every call's workspace starts as NaNs (0xff bytes, emulated_device.h): a kernel that read a
  // workspace value its call did not write would turn some output into NaN.
  struct Poison {
    Poison() { emulation::workspace_poison = 0xff; }
    ~Poison() { emulation::workspace_poison = -1; }
  } poison;
  const Mamba2Config c = ConfigOf(s);
  const Mamba2Layer<float> w = RandomLayer(c, 7 + s.D + s.G * 16 + s.P);
  std::vector<double> worst;
  std::vector<std::string> names;
  for (const auto& [t0, L] : chunks) {
    const Inputs in = RandomInputs(c, t0, L, 100 * t0 + L);
    const Outputs<double> want = RunCpu(c, w, in);
    const Outputs<float> got = RunDevice(c, w, in, 1);
    ASSERT_EQ(got.names, want.names);
    for (size_t q = 0; q < want.names.size(); ++q) {
      const double e = RelErr(got.values[q], want.values[q]);
      EXPECT_LT(e, kTol) << want.names[q] << " at t0 " << t0 << ", L " << L;
      size_t k = 0;
      while (k < names.size() && names[k] != want.names[q]) ++k;
      if (k == names.size()) names.push_back(want.names[q]), worst.push_back(0);
      if (!(e <= worst[k])) worst[k] = e;
    }
  }
  for (size_t k = 0; k < names.size(); ++k)
    std::printf("  worst relative error %-22s %.2e\n", names[k].c_str(), worst[k]);
}

class Mamba2EmulationTest : public ::testing::TestWithParam<Shape> {};

// (t0, L): no halo, a halo cut by the sequence's start, a full halo of W - 1 rows. The 70-row
// chunk (most of the emulation's time) at t0 = 0 in two shapes, at t0 = 9 in the other two.
TEST_P(Mamba2EmulationTest, MatchesCpuF64) {
  const int64_t t0_long = (GetParam().G + GetParam().P / 4) % 2 == 0 ? 0 : 9;
  ExpectMatchesCpu(GetParam(), {{0, 1}, {0, 7}, {2, 7}, {9, 1}, {9, 7}, {t0_long, 70}});
}

// A shape whose loops stride: P N = 512 state elements per head over the scan's 256 threads,
// M = Di / G = 320 channels per group over the gated norm's 256; and P = 64 rows of the
// state for the per-row sums.
TEST(Mamba2EmulationWideTest, StridedLoopsMatchCpuF64) {
  ExpectMatchesCpu({160, 1, 64, true}, {{9, 7}});
}

// A repeated call gives the same bits, and gradients accumulate: two backward calls into the
// same accumulators give grad + grad (one f32 add per entry, exact: a doubling, which also
// shows the second call's gradient the first's bits), with every other output as one call's.
// The shape of four heads per group and a clamped dt; a short chunk with a full halo (the
// emulation's time goes mostly to the 70-row chunks of the tests above).
TEST(Mamba2EmulationRepeatTest, RepeatsBitwiseAndAccumulates) {
  const Mamba2Config c = ConfigOf({16, 2, 4, true});
  const Mamba2Layer<float> w = RandomLayer(c, 3);
  const Inputs in = RandomInputs(c, 9, 7, 5);
  const Outputs<float> once = RunDevice(c, w, in, 1), twice = RunDevice(c, w, in, 2);
  ASSERT_EQ(once.names, twice.names);
  for (size_t q = 0; q < once.names.size(); ++q) {
    const std::vector<float>& a = once.values[q];
    const bool grad = once.names[q].find("grad ") != std::string::npos;
    if (once.names[q] == "halo du") {
      // Added to the incoming du twice: in + x + x, against (in + x) + x from one call's bits.
      for (size_t k = 0; k < a.size(); ++k) {
        const float want = a[k] + (a[k] - in.du_halo[k]);
        EXPECT_NEAR(twice.values[q][k], want, 1e-6f * (1 + std::fabs(want))) << "halo du";
      }
      continue;
    }
    for (size_t k = 0; k < a.size(); ++k) {
      const float want = grad ? a[k] + a[k] : a[k];
      ASSERT_EQ(std::memcmp(&twice.values[q][k], &want, sizeof(float)), 0)
          << once.names[q] << "[" << k << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Mamba2EmulationTest,
                         ::testing::Values(Shape{16, 1, 4, false}, Shape{16, 1, 16, false},
                                           Shape{16, 2, 4, true}, Shape{16, 2, 16, true}),
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
