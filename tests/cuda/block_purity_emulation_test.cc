// The CUDA block's and head's results are pure functions of their inputs (emulated on the host,
// emulated_device.h): the device workspace is shared by every call of a context and never
// cleared, so a kernel that read a byte its own call did not write would make a task's result
// depend on the task that ran before it on the same GPU. Each task runs once on a fresh block
// over a zeroed workspace, then again after other tasks (other lengths, halos, layers) with the
// workspace filled with other patterns (NaN bytes among them); outputs must be bitwise equal.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tests/cuda/emulated_device.h"

namespace adjsh {
namespace {

struct Task {
  int64_t halo, len;
  bool has_mu;
};

// Every output of a forward and a backward call, in one list of tensors.
using Outputs = std::vector<std::vector<float>>;

class Layer {
 public:
  Layer(const MambaConfig& config, uint64_t seed, bool bf16)
      : config_(config), params_(InitParams<float>(config, seed)) {
    block_ = std::make_unique<cuda::DeviceBlock>(
        0, bf16, cuda::BlockShapeOf(config), cuda::LayerTensorsOf<const float>(params_.layers[0]));
  }

  Outputs Run(const Task& task, uint64_t seed) {
    const int64_t D = config_.hidden_size, DiN = config_.inner() * config_.state_size;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0, 1);
    auto random = [&](int64_t n, float scale) {
      std::vector<float> v(n);
      for (float& x : v) x = scale * dist(rng);
      return v;
    };
    const std::vector<float> u = random((task.halo + task.len) * D, 1), h0 = random(DiN, 0.2f),
                             mu = random(DiN, 0.05f), g = random(task.len * D, 0.05f);
    std::vector<float> y(task.len * D), h_end(DiN), du(task.len * D), du_halo(task.halo * D),
        mu_out(DiN);
    LayerParams<float> grad = ZeroLayer<float>(config_);
    block_->Forward(u.data(), task.halo, task.len, h0.data(), y.data(), h_end.data());
    block_->Backward(u.data(), task.halo, task.len, g.data(), h0.data(),
                     task.has_mu ? mu.data() : nullptr, cuda::LayerTensorsOf<float>(grad),
                     du.data(), du_halo.data(), mu_out.data());
    Outputs out = {y, h_end, du, du_halo, mu_out};
    for (const auto& slot : LayerParamSlots<float>()) out.push_back(grad.*slot.member);
    return out;
  }

 private:
  MambaConfig config_;
  ModelParams<float> params_;
  std::unique_ptr<cuda::DeviceBlock> block_;
};

Outputs Head(bool bf16, int64_t M, uint64_t seed) {
  const int64_t D = 8, V = 40;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0, 1);
  std::vector<float> E(V * D), w(D), u(M * D), du(M * D), dE(V * D, 0.0f), dw(D, 0.0f);
  for (float& x : E) x = 0.5f * dist(rng);
  for (float& x : w) x = 1 + 0.1f * dist(rng);
  for (float& x : u) x = dist(rng);
  std::vector<int64_t> targets(M);
  for (int64_t t = 0; t < M; ++t) targets[t] = t + 1 < M ? (t * 7919) % V : -1;
  const double loss = cuda::DeviceHead(0, bf16, M, D, V, 1e-5f, E.data(), w.data(), u.data(),
                                       targets.data(), 1.0f / static_cast<float>(M - 1),
                                       du.data(), dE.data(), dw.data());
  return {du, dE, dw, {static_cast<float>(loss)}};
}

::testing::AssertionResult Bitwise(const Outputs& a, const Outputs& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "output counts differ";
  for (size_t q = 0; q < a.size(); ++q) {
    if (a[q].size() != b[q].size() ||
        std::memcmp(a[q].data(), b[q].data(), a[q].size() * sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "output " << q << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

class BlockPurityTest : public ::testing::TestWithParam<bool> {
 protected:
  void TearDown() override { emulation::workspace_poison = -1; }
};

TEST_P(BlockPurityTest, TaskResultDependsOnItsInputsOnly) {
  const bool bf16 = GetParam();
  const MambaConfig config = testing::SmallConfig(1, 16, 8, 4, 3, 29);
  // A chunk with a halo, a first chunk, a 1-row last chunk; before them a longer task.
  const std::vector<Task> tasks = {{3, 20, true}, {0, 9, true}, {2, 1, false}};
  const std::vector<Task> others = {{0, 40, true}};
  for (size_t q = 0; q < tasks.size(); ++q) {
    emulation::workspace_poison = 0;
    const Outputs fresh = Layer(config, 7, bf16).Run(tasks[q], 100 + q);
    for (int poison : {0xFF}) {  // NaN bytes
      // The same layer's block after other tasks of its own and of another layer's block.
      emulation::workspace_poison = poison;
      Layer layer(config, 7, bf16), other(config, 8, bf16);
      for (size_t o = 0; o < others.size(); ++o) {
        layer.Run(others[o], 200 + o);
        other.Run(others[(o + 1) % others.size()], 300 + o);
      }
      EXPECT_TRUE(Bitwise(fresh, layer.Run(tasks[q], 100 + q)))
          << "task " << q << " (halo " << tasks[q].halo << ", len " << tasks[q].len
          << ") with workspace bytes 0x" << std::hex << poison;
    }
  }
}

TEST_P(BlockPurityTest, HeadResultDependsOnItsInputsOnly) {
  const bool bf16 = GetParam();
  for (int64_t M : {21, 3}) {
    emulation::workspace_poison = 0;
    const Outputs fresh = Head(bf16, M, 40 + M);
    for (int poison : {0xFF}) {
      emulation::workspace_poison = poison;
      Head(bf16, 40, 1);  // a larger call first
      EXPECT_TRUE(Bitwise(fresh, Head(bf16, M, 40 + M)))
          << "head rows " << M << " with workspace bytes 0x" << std::hex << poison;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, BlockPurityTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "bf16" : "f32";
                         });

}  // namespace
}  // namespace adjsh
