#include "kernels/cuda/cuda_backend.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kernels/cuda/device_block.h"
#include "kernels/cuda/device_row_space.h"
#include "kernels/cuda/device_rows.h"
#include "kernels/cuda/mamba2_block.h"

namespace adjsh::cuda {
namespace {

// A Mamba-2 layer on the GPU (kernels/cuda/mamba2_block.h), f32 storage; resident: its
// pointers are the device's rows (DeviceRowSpace below).
class CudaMamba2Block final : public Mamba2BlockBackend<float> {
 public:
  CudaMamba2Block(const Device& device, const Mamba2Config& c,
                  const Mamba2Tensors<const float>& w, bool resident)
      : block_(device.index, Mamba2ShapeOf(c), w, resident) {}

  void Forward(const float* u, int64_t t0, int64_t t1, float* S, float* out,
               float* dt_sum) override {
    block_.Forward(u, t0, t1, S, out, dt_sum);
  }
  void Adjoint(const float* u, int64_t t0, int64_t t1, const float* S0, const float* dout,
               float* carry) override {
    block_.Adjoint(u, t0, t1, S0, dout, carry);
  }
  void Backward(const float* u, int64_t t0, int64_t t1, const float* S0, const float* dout,
                float* carry, float* halo, const Mamba2Tensors<float>& grad,
                float* du) override {
    block_.Backward(u, t0, t1, S0, dout, carry, halo, grad, du, /*defer_grad=*/true);
  }
  void HaloBackward(const float* u, int64_t t0, const float* halo,
                    const Mamba2Tensors<float>& grad, float* du) override {
    block_.HaloBackward(u, t0, halo, grad, du, /*defer_grad=*/true);
  }
  void FinishBackward(const Mamba2Tensors<float>& grad) override { block_.FinishBackward(grad); }
  void FoldForward(const float* u, int64_t t0, int64_t t1, float* S, float* sigma) override {
    block_.FoldForward(u, t0, t1, S, sigma);
  }
  void BackwardInto(const float* u, int64_t t0, int64_t t1, const float* S0, const float* dout,
                    float* carry, float* halo, float* sum, float* du) override {
    block_.Backward(u, t0, t1, S0, dout, carry, halo, Mamba2Tensors<float>{}, du,
                    /*defer_grad=*/false, sum);
  }
  void HaloBackwardInto(const float* u, int64_t t0, const float* halo, float* sum,
                        float* du) override {
    block_.HaloBackward(u, t0, halo, Mamba2Tensors<float>{}, du, /*defer_grad=*/false, sum);
  }

 private:
  DeviceMamba2Block block_;
};

// A layer's block; resident: its pointers are the device's rows (DeviceRowSpace below).
class CudaBlock final : public BlockBackend<float> {
 public:
  CudaBlock(const Device& device, const MambaConfig& c, const LayerParams<float>& p,
            bool resident)
      : block_(device.index, device.bf16_storage, BlockShapeOf(c),
               LayerTensorsOf<const float>(p), resident) {}

  void Forward(const float* u, cpu::ChunkRows rows, const float* h0, float* u_next,
               float* h_end) override {
    ADJSH_CHECK(rows.ahead == 0, "the chunk forward has no lookahead rows");
    block_.Forward(u, rows.halo, rows.len, h0, u_next, h_end);
  }
  void LocalSummary(const float* u, cpu::ChunkRows rows, float* h_local, float* S) override {
    ADJSH_CHECK(rows.ahead == 0, "the chunk summaries have no lookahead rows");
    block_.LocalSummary(u, rows.halo, rows.len, h_local, S);
  }
  void AdjointSummary(const float* u, cpu::ChunkRows rows, const float* g, float* m,
                      float* S) override {
    ADJSH_CHECK(rows.ahead == 0, "the chunk summaries have no lookahead rows");
    block_.AdjointSummary(u, rows.halo, rows.len, g, m, S);
  }
  void Backward(const float* u, cpu::ChunkRows rows, const float* g, const float* h0,
                const float* mu, int64_t window, LayerParams<float>& grad, float* du,
                float* du_halo, float* mu_out) override {
    ADJSH_CHECK(window == 0 && rows.ahead == 0,
                "the truncated window is not supported on CUDA (Require refuses it)");
    block_.Backward(u, rows.halo, rows.len, g, h0, mu, LayerTensorsOf<float>(grad), du, du_halo,
                    mu_out);
  }
  // The span schedule's backward: a task's chunks add into one accumulator on the device, which
  // FinishBackward brings down once (kernels/cuda/device_block.h).
  void BackwardDeferred(std::unique_ptr<KeptActs>, const float* u, cpu::ChunkRows rows,
                        const float* g, const float* h0, const float* mu,
                        LayerParams<float>& grad, float* du, float* du_halo,
                        float* mu_out) override {
    ADJSH_CHECK(rows.ahead == 0, "the exact backward has no lookahead rows");
    block_.Backward(u, rows.halo, rows.len, g, h0, mu, LayerTensorsOf<float>(grad), du, du_halo,
                    mu_out, /*defer_grad=*/true);
  }
  void FinishBackward(LayerParams<float>& grad) override {
    block_.FinishBackward(LayerTensorsOf<float>(grad));
  }
  void BackwardInto(const float* u, cpu::ChunkRows rows, const float* g, const float* h0,
                    const float* mu, float* sum, float* du, float* du_halo,
                    float* mu_out) override {
    ADJSH_CHECK(rows.ahead == 0, "the exact backward has no lookahead rows");
    block_.Backward(u, rows.halo, rows.len, g, h0, mu, LayerTensors<float>{}, du, du_halo, mu_out,
                    /*defer_grad=*/false, sum);
  }
  void FoldLocalSummary(const float* u, cpu::ChunkRows rows, float* state,
                        float* sigma) override {
    ADJSH_CHECK(rows.ahead == 0, "the chunk summaries have no lookahead rows");
    block_.FoldLocalSummary(u, rows.halo, rows.len, state, sigma);
  }
  void FoldAdjointSummary(const float* u, cpu::ChunkRows rows, const float* g,
                          float* carry) override {
    ADJSH_CHECK(rows.ahead == 0, "the chunk summaries have no lookahead rows");
    block_.FoldAdjointSummary(u, rows.halo, rows.len, g, carry);
  }

 private:
  DeviceBlock block_;
};

class CudaResidentHead final : public ResidentHead<float> {
 public:
  CudaResidentHead(const Device& device, const float* embed, const float* head,
                   const float* w_f, int64_t V, int64_t D)
      : weights_(device.index, device.bf16_storage, V, D, embed, head, w_f) {}
  void Gather(const uint32_t* ids, int64_t n, float* rows) override {
    weights_.Gather(ids, n, rows);
  }
  double ForwardBackward(const cpu::LmHeadArgs<float>& a, const uint32_t* next_ids,
                         int64_t valid, float* du, float* dE, float* dw_f,
                         float* dE_nonfinite) override {
    return weights_.ForwardBackward(a.M, static_cast<float>(a.eps), a.u, next_ids, valid,
                                    a.scale, du, dE, dw_f, dE_nonfinite);
  }
  double Loss(const cpu::LmHeadArgs<float>& a, const uint32_t* next_ids,
              int64_t valid) override {
    return weights_.Loss(a.M, static_cast<float>(a.eps), a.u, next_ids, valid);
  }
  void LookupBackward(const uint32_t* ids, int64_t n, const float* g, float* dE) override {
    weights_.LookupBackward(ids, n, g, dE);
  }

 private:
  DeviceHeadWeights weights_;
};

}  // namespace

bool CudaSupports(Op op) {
  return op == Op::kForward || op == Op::kLocalSummary || op == Op::kAdjointSummary ||
         op == Op::kBackwardExact || op == Op::kHead || op == Op::kMamba2Layer;
}

namespace {

class CudaBackend final : public Backend<float> {
 public:
  explicit CudaBackend(const Device& device)
      : device_(device), rows_(device.index, device.row_budget) {}
  const Device& device() const override { return device_; }
  bool Supports(Op op) const override { return CudaSupports(op); }
  absl::Status CheckConfig(const MambaConfig& config) const override {
    if (config.state_size > kMaxStateSize) {
      return absl::UnimplementedError(absl::StrCat("state_size ", config.state_size, " > ",
                                                   kMaxStateSize, " is not supported on ",
                                                   device_.ToString()));
    }
    return absl::OkStatus();
  }
  std::unique_ptr<BlockBackend<float>> MakeBlock(const MambaConfig& config,
                                                 const LayerParams<float>& params) override {
    return std::make_unique<CudaBlock>(device_, config, params, /*resident=*/false);
  }
  RowSpace<float>* ResidentRows() override { return &rows_; }
  std::unique_ptr<BlockBackend<float>> MakeResidentBlock(
      const MambaConfig& config, const LayerParams<float>& params) override {
    return std::make_unique<CudaBlock>(device_, config, params, /*resident=*/true);
  }
  // f32 storage only: MakeMamba2Block is not called with bf16 storage
  // (kernels/mamba2_chunk_ops.cc refuses it by name).
  std::unique_ptr<Mamba2BlockBackend<float>> MakeMamba2Block(
      const Mamba2Config& config, const Mamba2Tensors<const float>& weights) override {
    ADJSH_CHECK(!device_.bf16_storage, "a Mamba-2 layer on the GPU keeps f32");
    return std::make_unique<CudaMamba2Block>(device_, config, weights, /*resident=*/false);
  }
  std::unique_ptr<Mamba2BlockBackend<float>> MakeResidentMamba2Block(
      const Mamba2Config& config, const Mamba2Tensors<const float>& weights) override {
    ADJSH_CHECK(!device_.bf16_storage, "a Mamba-2 layer on the GPU keeps f32");
    return std::make_unique<CudaMamba2Block>(device_, config, weights, /*resident=*/true);
  }
  double HeadForwardBackward(const cpu::LmHeadArgs<float>& a, float* du, float* dE,
                             float* dw_f) override {
    return DeviceHead(device_.index, device_.bf16_storage, a.M, a.D, a.V,
                      static_cast<float>(a.eps), a.E, a.w_f, a.u, a.targets, a.scale, du, dE,
                      dw_f);
  }
  std::unique_ptr<ResidentHead<float>> MakeResidentHead(const float* embed, const float* head,
                                                        const float* w_f, int64_t V,
                                                        int64_t D) override {
    return std::make_unique<CudaResidentHead>(device_, embed, head, w_f, V, D);
  }
  DeviceMemoryProbe MemoryProbe() const override { return DeviceMemoryProbeOf(device_.index); }
  DeviceTraffic ThreadTraffic() const override { return cuda::ThreadTraffic(); }

 private:
  Device device_;
  DeviceRowSpace rows_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend<float>>> MakeCudaBackend(const Device& device) {
  std::string error;
  const int count = DeviceCount(&error);
  if (count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(device.ToString(), " requested, but no CUDA device is usable here (", error,
                     ")"));
  }
  if (device.index >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        device.ToString(), " requested, but this machine has ", count, " CUDA device(s)"));
  }
  if (!CublasUsable(&error)) {
    return absl::FailedPreconditionError(
        absl::StrCat(device.ToString(), " requested, but ", error));
  }
  return std::unique_ptr<Backend<float>>(std::make_unique<CudaBackend>(device));
}

}  // namespace adjsh::cuda
