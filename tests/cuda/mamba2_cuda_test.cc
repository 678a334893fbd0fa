// The CUDA Mamba-2 layer (kernels/cuda/mamba2_block.h) on a GPU against the CPU layer
// (kernels/cpu/mamba2_layer.h) in f64 from the same weights, at the shapes of
// tests/cuda/mamba2_emulation_test.cc (which runs the same device code on the host): D 16 with
// G in {1, 2} x head_dim in {4, 16} (dt clamped with G = 2), and D 160, head_dim 64 (the
// kernels' strided loops); chunks at t0 in {0, 2, 9} with L in {1, 7, 70}: every output of
// Forward, Adjoint, Backward and HaloBackward and every parameter gradient within 1e-5
// relative; and a repeated call gives the same bits. Every test skips where there is no GPU.
// Built into cuda_backend_test (tests/cuda/CMakeLists.txt), so scripts/gpu-check.sh runs it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device_block.h"
#include "kernels/cuda/mamba2_block.h"
#include "tests/cuda/mamba2_check.h"

namespace adjsh {
namespace {

// f32 against f64: each operation rounds at 6e-8 relative and no sum at these shapes has more
// than several hundred terms, so each tensor's ||a - b|| / ||b|| stays near 1e-6 unless a term
// is wrong (the emulation test reports the worst per tensor).
constexpr double kTol = 1e-5;

using testing::ConfigOf;
using testing::Inputs;
using testing::Mamba2RelErr;
using testing::Outputs;
using testing::RandomInputs;
using testing::RandomLayer;
using testing::RunCpu;
using testing::RunDevice;
using testing::Shape;
using testing::ShapeName;

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
        const double e = Mamba2RelErr(got.values[q], want.values[q]);
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
                         ShapeName);

}  // namespace
}  // namespace adjsh
