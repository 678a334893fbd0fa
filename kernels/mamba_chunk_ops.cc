#include "kernels/mamba_chunk_ops.h"

#include <algorithm>
#include <utility>

#include "kernels/decay.h"

namespace adjsh {
namespace {

template <typename T>
class MambaChunkOps final : public ChunkOps<T, LayerParams<T>> {
 public:
  using Kept = std::unique_ptr<KeptActs>;

  // A: the layer's decay rates (Di, N).
  MambaChunkOps(std::unique_ptr<BlockBackend<T>> block, const MambaConfig& config,
                std::vector<T> A)
      : block_(std::move(block)),
        cfg_(config),
        Di_(config.inner()),
        N_(config.state_size),
        A_(std::move(A)) {}

  int64_t state_size() const override { return Di_ * N_; }
  int64_t sigma_size() const override { return Di_; }
  bool keeps_chunk_states() const override { return true; }
  HaloGrad halo_grad() const override { return HaloGrad::kRows; }
  int64_t conv_carry_size() const override { return 0; }
  LayerParams<T> ZeroLayer() const override { return adjsh::ZeroLayer<T>(cfg_); }

  Kept FoldForward(const T* u, ChunkSpan c, T* state, T* sigma) override {
    Scratch& sc = ThreadScratch();
    Kept kept = block_->LocalSummaryKeep(u, Rows(c), sc.local.data(), sc.S.data());
    Combine(sc, state);
    for (int64_t i = 0; i < Di_; ++i) sigma[i] += sc.S[i];
    return kept;
  }
  Kept Forward(Kept kept, const T* u, ChunkSpan c, const T* h0, T* out, T* h_end,
               int64_t room_for) override {
    return block_->ForwardKept(std::move(kept), u, Rows(c), h0, out, h_end, room_for);
  }
  Kept FoldAdjoint(Kept carried, const T* u, ChunkSpan c, const T*, const T* g,
                   T* carry) override {
    Scratch& sc = ThreadScratch();
    Kept kept =
        block_->AdjointSummaryKeep(std::move(carried), u, Rows(c), g, sc.local.data(), sc.S.data());
    Combine(sc, carry);
    return kept;
  }
  void Backward(Kept kept, const T* u, ChunkSpan c, const T* h0, const T* g, const T* mu,
                T* mu_out, T*, LayerParams<T>& grad, T* du, T* du_halo) override {
    block_->BackwardDeferred(std::move(kept), u, Rows(c), g, h0, mu, grad, du, du_halo, mu_out);
  }
  void HaloBackward(const T*, int64_t, const T*, LayerParams<T>&, T*) override {}
  void FinishBackward(LayerParams<T>& grad) override { block_->FinishBackward(grad); }

 private:
  // A summary's parts per thread: spans run on several threads at once through one layer.
  struct Scratch {
    std::vector<T> local, S, next;
  };
  Scratch& ThreadScratch() const {
    thread_local Scratch sc;
    sc.local.resize(Di_ * N_), sc.S.resize(Di_), sc.next.resize(Di_ * N_);
    return sc;
  }
  static cpu::ChunkRows Rows(ChunkSpan c) { return {c.halo, c.len, 0}; }
  // v = exp(A S_c) v + local: the chunk's local summary after what came before it.
  void Combine(Scratch& sc, T* v) const {
    DecayAdd(A_.data(), sc.S.data(), v, sc.local.data(), Di_ * N_, N_, sc.next.data());
    std::copy(sc.next.begin(), sc.next.end(), v);
  }

  std::unique_ptr<BlockBackend<T>> block_;
  const MambaConfig& cfg_;
  const int64_t Di_, N_;
  const std::vector<T> A_;
};

}  // namespace

template <typename T>
LayerModel<ModelParams<T>> MakeLayerModel(const ModelParams<T>& params, Backend<T>& backend) {
  LayerModel<ModelParams<T>> m;
  m.params = &params;
  m.backend = &backend;
  const std::vector<T> A = DecayRates(params);
  const int64_t DiN = params.config.inner() * params.config.state_size;
  for (size_t k = 0; k < params.layers.size(); ++k) {
    m.layers.push_back(std::make_unique<MambaChunkOps<T>>(
        backend.MakeBlock(params.config, params.layers[k]), params.config,
        std::vector<T>(A.begin() + k * DiN, A.begin() + (k + 1) * DiN)));
  }
  return m;
}

template <typename T>
absl::StatusOr<DeviceModel<ModelParams<T>>> MakeDeviceModel(const ModelParams<T>& params,
                                                             const Device& device,
                                                             std::initializer_list<Op> ops) {
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend =
      MakeBackendFor<T>(device, params.config, ops);
  if (!backend.ok()) return backend.status();
  DeviceModel<ModelParams<T>> m;
  m.backend = *std::move(backend);
  m.model = MakeLayerModel(params, *m.backend);
  return m;
}

template LayerModel<ModelParams<float>> MakeLayerModel(const ModelParams<float>&, Backend<float>&);
template LayerModel<ModelParams<double>> MakeLayerModel(const ModelParams<double>&,
                                                        Backend<double>&);
template absl::StatusOr<DeviceModel<ModelParams<float>>> MakeDeviceModel(
    const ModelParams<float>&, const Device&, std::initializer_list<Op>);
template absl::StatusOr<DeviceModel<ModelParams<double>>> MakeDeviceModel(
    const ModelParams<double>&, const Device&, std::initializer_list<Op>);

}  // namespace adjsh
