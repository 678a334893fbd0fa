// The two forms of the Mamba-2 scan (kernels/cpu/mamba2_scan.h) compute one function: in f64 the
// block form's outputs, states, carries and every input gradient agree with the plain
// recurrence's to 1e-12 (relative to each tensor's largest value), over G in {1, 2}, head_dim
// in {4, 16}, chunk rows on and off the block size, and decays from mild to near-total; in f32
// to 1e-5. The block form's states-only forward gives the bits of its full forward, which the
// span schedule's sweep relies on (engine/span_math.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/mamba2_scan.h"

namespace adjsh {
namespace {

struct Shape {
  int64_t G, P, L;
  double dt_max;  // dt in (0, dt_max]: with A near -1 .. -4, per-row decays down to exp(-4 dt)
};

Mamba2Config ConfigOf(const Shape& s) {
  Mamba2Config c;
  c.hidden_size = 4 * s.P, c.head_dim = s.P, c.num_heads = 8, c.n_groups = s.G;
  c.state_size = 8, c.expand = 2, c.num_hidden_layers = 1, c.vocab_size = 8;
  return c;
}

// One chunk's scan inputs and the gradients flowing in, random from a seed.
template <typename T>
struct Case {
  Mamba2Dims d;
  int64_t L;
  std::vector<T> dt, xbc, A, Dskip, S0, dy, carry;
  Case(const Shape& s, uint64_t seed) : d(ConfigOf(s)), L(s.L) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1, 1), pos(0.05, 1);
    auto fill = [&](std::vector<T>& v, int64_t n) {
      v.resize(n);
      for (T& x : v) x = T(u(rng));
    };
    dt.resize(L * d.H);
    for (T& x : dt) x = T(pos(rng) * s.dt_max);
    A.resize(d.H);
    for (int64_t h = 0; h < d.H; ++h) A[h] = T(-1 - 3.0 * h / d.H);
    fill(xbc, L * d.Cc), fill(Dskip, d.H), fill(S0, d.H * d.P * d.N);
    fill(dy, L * d.Di), fill(carry, d.H * d.P * d.N);
  }
  Mamba2ScanRows<T> Rows() const { return {&d, L, dt.data(), xbc.data(), A.data(), Dskip.data()}; }
};

// Everything one form computes on a case.
template <typename T>
struct Outputs {
  std::vector<T> y, S, states_only, carry, adjoint, dxbc, ddt, dA, dD;
};

template <typename T>
Outputs<T> Run(Mamba2ScanForm form, const Case<T>& c) {
  const Mamba2Dims& d = c.d;
  Outputs<T> o;
  o.y.assign(c.L * d.Di, T(0));
  o.S = c.S0;
  Mamba2ScanForward(form, c.Rows(), o.S.data(), o.y.data());
  o.states_only = c.S0;
  Mamba2ScanForward<T>(form, c.Rows(), o.states_only.data(), nullptr);
  o.carry = c.carry;
  o.dxbc.assign(c.L * d.Cc, T(0)), o.ddt.assign(c.L * d.H, T(0));
  o.dA.assign(d.H, T(0)), o.dD.assign(d.H, T(0));
  Mamba2ScanBackward(form, c.Rows(), c.S0.data(), c.dy.data(), o.carry.data(), o.dxbc.data(),
                     o.ddt.data(), o.dA.data(), o.dD.data());
  o.adjoint = c.carry;
  Mamba2ScanAdjoint(form, c.Rows(), c.dy.data(), o.adjoint.data());
  return o;
}

template <typename T>
void ExpectClose(const std::vector<T>& a, const std::vector<T>& b, double tol, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 1e-30, worst = 0;
  for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::abs(double(b[i])));
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / scale);
  EXPECT_LT(worst, tol) << what << " (largest " << scale << ")";
}

template <typename T>
void ExpectFormsAgree(const Shape& s, double tol) {
  const Case<T> c(s, 17 + s.L + 100 * s.G + 1000 * s.P);
  const Outputs<T> plain = Run(Mamba2ScanForm::kPlain, c), blocks = Run(Mamba2ScanForm::kBlocks, c);
  SCOPED_TRACE(testing::Message() << "G=" << s.G << " P=" << s.P << " L=" << s.L
                                  << " dt_max=" << s.dt_max);
  ExpectClose(blocks.y, plain.y, tol, "y");
  ExpectClose(blocks.S, plain.S, tol, "S");
  ExpectClose(blocks.carry, plain.carry, tol, "dL/dS0");
  ExpectClose(blocks.adjoint, plain.adjoint, tol, "adjoint carry");
  ExpectClose(blocks.dxbc, plain.dxbc, tol, "dxbc");
  ExpectClose(blocks.ddt, plain.ddt, tol, "ddt");
  ExpectClose(blocks.dA, plain.dA, tol, "dA");
  ExpectClose(blocks.dD, plain.dD, tol, "dD");
  // The states-only sweep: the full forward's bits, in either form.
  EXPECT_EQ(std::memcmp(blocks.S.data(), blocks.states_only.data(), blocks.S.size() * sizeof(T)),
            0);
  EXPECT_EQ(std::memcmp(plain.S.data(), plain.states_only.data(), plain.S.size() * sizeof(T)),
            0);
}

std::vector<Shape> Shapes() {
  std::vector<Shape> out;
  for (int64_t G : {1, 2})
    for (int64_t P : {4, 16})
      for (int64_t L : {1, 7, 63, 64, 65, 130, 256}) out.push_back({G, P, L, 0.5});
  out.push_back({1, 16, 200, 4.0});   // decays to ~e^-16 a row: products underflow inside a block
  out.push_back({2, 4, 129, 0.01});   // decays near 1: long memory
  return out;
}

TEST(Mamba2ScanTest, BlockFormIsThePlainRecurrenceInF64) {
  for (const Shape& s : Shapes()) ExpectFormsAgree<double>(s, 1e-12);
}

TEST(Mamba2ScanTest, BlockFormIsThePlainRecurrenceInF32) {
  for (const Shape& s : Shapes()) ExpectFormsAgree<float>(s, 1e-5);
}

}  // namespace
}  // namespace adjsh
