// The CUDA block (its forward, backward and span summaries) and head (emulated on the host,
// emulated_device.h) at the shapes that reach the multi-block paths, against the CPU in f64: D and
// Di wide enough for several channel blocks of the scan (256 / L channels a block, L = the state
// lanes: N = 1, 16, 32), of the weight-gradient reductions (32 columns a block) and several slices
// of rows; and the head with the GPU's blocks (1024 rows x 8192 vocabulary entries, not
// block_emulation_test's small ones) at V = 8193: two vocabulary blocks (the running log-sum-exp
// across them, the second of one entry); 40 rows, one row block (several row blocks:
// block_emulation_test's head, whose blocks are 8 rows; here 1025 rows would be a minute of
// emulated barriers). The long chunk (len > 4,194,304, where the scan's segments grow past 64 rows)
// runs in cuda_backend_test on a GPU only: on the host one emulated block per row of the norm makes
// it hours.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <random>
#include <vector>

#define ADJSH_CUDA_HEAD_ROWS 1024
#define ADJSH_CUDA_HEAD_VOCAB 8192
#include "tests/cuda/emulated_device.h"
#include "tests/cuda/block_check.h"

namespace adjsh {
namespace {

// f32 everywhere: each tensor within 1e-5 of f64 (as cuda_backend_test on a GPU; sums here
// are at most a few hundred terms per f32 accumulator).
constexpr double kTol = 1e-5;

struct Shape {
  int64_t D, N, R, W, halo, len;
};
// For gtest's messages (instead of the struct's bytes).
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "D=" << s.D << " N=" << s.N << " R=" << s.R << " W=" << s.W << " halo=" << s.halo
      << " len=" << s.len;
}

class ShapesEmulationTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ShapesEmulationTest, BlockMatchesCpuF64) {
  const Shape sh = GetParam();
  const MambaConfig config = testing::SmallConfig(1, sh.D, sh.N, sh.W, sh.R, 29);
  const testing::BlockCheck c =
      testing::CheckBlockAgainstCpu(config, 31, 5 + sh.N, sh.halo, sh.len, false);
  for (size_t q = 0; q < c.errors.size(); ++q) EXPECT_LT(c.errors[q], kTol) << c.names[q];
  const testing::SummaryCheck sc =
      testing::CheckSummariesAgainstCpu(config, 31, 7 + sh.N, sh.halo, sh.len, false);
  EXPECT_LT(sc.h_local, kTol) << "h_local";
  EXPECT_LT(sc.S_fwd, kTol) << "S (forward)";
  EXPECT_LT(sc.m, kTol) << "m";
  EXPECT_LT(sc.S_adj, kTol) << "S (adjoint)";
}

// len = 150 + halo 3: 3 scan segments and 3 slices of rows. N = 1: D = 160, Di = 320, 2 scan
// channel blocks, 5 and 10 weight-gradient column blocks; N = 16, 32: D = 48, Di = 96 (6 and 12
// scan channel blocks, 2 and 3 column blocks; smaller: the emulated warp shuffles of 16 and 32
// lanes are what takes the time on the host).
INSTANTIATE_TEST_SUITE_P(Shapes, ShapesEmulationTest,
                         ::testing::Values(Shape{160, 1, 10, 4, 3, 150},
                                           Shape{48, 16, 6, 4, 3, 150},
                                           Shape{48, 32, 6, 4, 3, 150}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return "N" + std::to_string(info.param.N);
                         });

TEST(ShapesEmulationHeadTest, VocabularyAndRowsAboveOneBlock) {
  const int64_t M = 40, D = 8, V = 8193;
  std::vector<int64_t> targets(M);
  // Targets in both vocabulary blocks, the last entry (the second block's only one) among them.
  for (int64_t t = 0; t < M; ++t) targets[t] = t + 1 < M ? (t * 7919) % V : -1;
  targets[5] = V - 1;
  const testing::HeadCheck c = testing::CheckHeadAgainstCpu(M, D, V, 6, targets, false);
  EXPECT_NEAR(c.loss32, c.loss, 1e-5 * c.loss);
  EXPECT_LT(c.du, kTol) << "du";
  EXPECT_LT(c.dE, kTol) << "dE";
  EXPECT_LT(c.dw_f, kTol) << "dw_f";
}

}  // namespace
}  // namespace adjsh
