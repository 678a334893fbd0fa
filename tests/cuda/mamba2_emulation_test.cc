// The CUDA Mamba-2 layer (kernels/cuda/mamba2_block.cu with mamba2_kernels.cuh) compiled for
// the host: kernels run block by block on host threads (host_emulation.h), device memory is
// host memory, cuBLAS is a plain f32 GEMM over the same row-major operands (emulated_device.h,
// which also brings the Mamba-1 block's code: the names do not meet). Checked against the CPU
// layer (kernels/cpu/mamba2_layer.h) in f64 from the same weights: Forward (with and without out),
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
#include "tests/cuda/mamba2_check.h"

namespace adjsh {
namespace {

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

// f32 against f64: each operation rounds at 6e-8 relative, and at these shapes no sum has more
// than several hundred terms (the scan: 70 rows; GEMMs: Dp = 661 at most), so a tensor's
// relative error (||a - b|| / ||b||) stays near 1e-6 unless a term is wrong or missing; the
// worst seen is printed per tensor.
constexpr double kTol = 1e-5;

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
      const double e = Mamba2RelErr(got.values[q], want.values[q]);
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

// Sums kept on the device across a task's calls (defer_grad, then FinishBackward) give the
// bits of the sums moved both ways per call, every output alike, with the layer's gradient
// moved once each way (9 tensors up at the first call, 9 down at the end) where per call it
// went up and down every time.
TEST(Mamba2EmulationRepeatTest, DeferredSumsAreTheSameBitsMovedOnce) {
  const Mamba2Config c = ConfigOf({16, 2, 4, true});
  const Mamba2Layer<float> w = RandomLayer(c, 3);
  const Inputs in = RandomInputs(c, 9, 7, 5);
  const DeviceTraffic t0 = cuda::ThreadTraffic();
  const Outputs<float> per_call = RunDevice(c, w, in, 3, false);
  const DeviceTraffic t1 = cuda::ThreadTraffic();
  const Outputs<float> deferred = RunDevice(c, w, in, 3, true);
  const DeviceTraffic t2 = cuda::ThreadTraffic();
  ASSERT_EQ(per_call.names, deferred.names);
  for (size_t q = 0; q < per_call.names.size(); ++q) {
    const std::vector<float>& a = per_call.values[q];
    ASSERT_EQ(a.size(), deferred.values[q].size()) << per_call.names[q];
    EXPECT_EQ(std::memcmp(a.data(), deferred.values[q].data(), a.size() * sizeof(float)), 0)
        << per_call.names[q];
  }
  const DeviceTraffic moved_per_call = t1 - t0, moved_deferred = t2 - t1;
  EXPECT_LT(moved_deferred.h2d_bytes, moved_per_call.h2d_bytes);
  EXPECT_LT(moved_deferred.d2h_copies, moved_per_call.d2h_copies);
  // Per call: 3 Backward calls x 9 tensors each way; deferred: 9 up and 9 down (the halo's
  // accumulator likewise: 3 x 2 per call against 9 and 9).
  EXPECT_EQ(moved_per_call.d2h_copies - moved_deferred.d2h_copies, (27u + 6u) - (9u + 9u));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Mamba2EmulationTest,
                         ::testing::Values(Shape{16, 1, 4, false}, Shape{16, 1, 16, false},
                                           Shape{16, 2, 4, true}, Shape{16, 2, 16, true}),
                         ShapeName);

}  // namespace
}  // namespace adjsh
