// The CPU Mamba block's chunk summaries against its full forward, bit for bit: LocalSummary
// (kernels/cpu/mamba_block.h) computes only the x half of in_proj, which must give the same x,
// so its h_local is the end state of Forward from a zero state, and its S the sum of Delta.
#include "kernels/cpu/mamba_block.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/model.h"
#include "tests/kernels/test_util.h"

namespace adjsh::cpu {
namespace {

template <typename T>
void CheckSummaryIsForwardFromZero(int64_t D, int64_t N, int64_t len) {
  const MambaConfig c = testing::SmallConfig(1, D, N);
  const ModelParams<T> params = InitParams<T>(c, 5);
  const MambaBlockCpu<T> block(c, params.layers[0]);
  const int64_t Di = c.inner(), halo = c.conv_kernel - 1;
  std::mt19937_64 rng(9);
  std::normal_distribution<double> g(0, 1);
  std::vector<T> u((halo + len) * D);
  for (auto& e : u) e = T(g(rng));
  std::vector<T> h_local(Di * N), S(Di), zeros(Di * N, T(0)), u_next(len * D), h_end(Di * N);
  block.LocalSummary(u.data(), {halo, len, 0}, h_local.data(), S.data());
  block.Forward(u.data(), {halo, len, 0}, zeros.data(), u_next.data(), h_end.data());
  EXPECT_EQ(std::memcmp(h_local.data(), h_end.data(), h_end.size() * sizeof(T)), 0);
}

TEST(MambaBlockCpuTest, LocalSummaryIsTheForwardFromAZeroState) {
  CheckSummaryIsForwardFromZero<float>(64, 16, 256);  // the engine's usual shapes
  CheckSummaryIsForwardFromZero<float>(10, 5, 37);    // channels past the last block of 8
  CheckSummaryIsForwardFromZero<double>(24, 16, 100);
}

}  // namespace
}  // namespace adjsh::cpu
