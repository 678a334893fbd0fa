// What a Mamba-2 model needs of a device (kernels/mamba2_chunk_ops.h), checked without a GPU on a
// stand-in backend that claims a CUDA device and lacks what a test names: each lack refused
// with UNIMPLEMENTED naming it, before any layer is made; a device whose backend makes no
// Mamba-2 layer refused likewise; the CPU takes everything.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>

#include "kernels/mamba2_chunk_ops.h"
#include "common/mamba2_init.h"

namespace adjsh {
namespace {

// A device backend that supports every op but `lacks`, and makes no Mamba-2 layer.
class StandIn final : public Backend<float> {
 public:
  StandIn(Device device, std::set<Op> lacks) : device_(device), lacks_(std::move(lacks)) {}
  const Device& device() const override { return device_; }
  bool Supports(Op op) const override { return lacks_.count(op) == 0; }
  std::unique_ptr<BlockBackend<float>> MakeBlock(const MambaConfig&,
                                                 const LayerParams<float>&) override {
    return nullptr;
  }
  double HeadForwardBackward(const cpu::LmHeadArgs<float>&, float*, float*, float*) override {
    return 0;
  }

 private:
  Device device_;
  std::set<Op> lacks_;
};

Device Cuda(bool bf16 = false) {
  Device d;
  d.kind = Device::Kind::kCuda;
  d.bf16_storage = bf16;
  return d;
}

void ExpectRefused(const absl::Status& s, const std::string& word) {
  EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
  EXPECT_NE(std::string(s.message()).find(word), std::string::npos) << s;
}

TEST(Mamba2BackendTest, EachLackOfTheDeviceIsRefusedByName) {
  ExpectRefused(CheckMamba2Backend<float>(StandIn(Cuda(), {Op::kMamba2Layer}), false),
                "a Mamba-2 layer");
  ExpectRefused(CheckMamba2Backend<float>(StandIn(Cuda(), {Op::kHead}), false), "LM head");
  // The head's greedy count only with a loss mask.
  const StandIn no_accuracy(Cuda(), {Op::kHeadAccuracy});
  EXPECT_TRUE(CheckMamba2Backend<float>(no_accuracy, false).ok());
  ExpectRefused(CheckMamba2Backend<float>(no_accuracy, true), "accuracy");
  ExpectRefused(CheckMamba2Backend<float>(StandIn(Cuda(true), {}), false), "bf16");
  EXPECT_TRUE(CheckMamba2Backend<float>(StandIn(Cuda(), {}), true).ok());
}

TEST(Mamba2BackendTest, ADeviceThatMakesNoLayerIsRefusedAndTheCpuTakesAll) {
  Mamba2Config c;
  c.hidden_size = 8, c.num_hidden_layers = 2, c.state_size = 4, c.head_dim = 4;
  c.num_heads = 4, c.n_groups = 1, c.vocab_size = 11;
  const Mamba2Params<float> params = InitMamba2Params<float>(c, 3).value();
  StandIn device(Cuda(), {});
  ExpectRefused(MakeLayerModel(params, device).status(), "cuda:0");
  std::unique_ptr<Backend<float>> cpu = MakeBackend<float>(Device{}).value();
  EXPECT_TRUE(CheckMamba2Backend<float>(*cpu, true).ok());
  absl::StatusOr<LayerModel<Mamba2Params<float>>> m = MakeLayerModel(params, *cpu);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->layers.size(), 2u);
}

}  // namespace
}  // namespace adjsh
