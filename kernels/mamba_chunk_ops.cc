#include "kernels/mamba_chunk_ops.h"

#include <algorithm>
#include <utility>

#include "common/check.h"
#include "kernels/decay.h"

namespace adjsh {
namespace {

template <typename T>
class MambaChunkOps final : public ChunkOps<T, LayerParams<T>> {
 public:
  using Kept = std::unique_ptr<KeptActs>;

  // A: the layer's decay rates (Di, N). space: where the block's pointers are; a device's
  // (resident) block folds the summaries and sums the gradient there itself.
  MambaChunkOps(std::unique_ptr<BlockBackend<T>> block, const MambaConfig& config,
                std::vector<T> A, RowSpace<T>& space)
      : space_(&space),
        resident_(!space.host()),
        block_(std::move(block)),
        grad_size_(resident_ ? LayerValues(config) : 0),
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
    if (resident_) {
      block_->FoldLocalSummary(u, Rows(c), state, sigma);
      return nullptr;
    }
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
    if (resident_) {
      block_->FoldAdjointSummary(u, Rows(c), g, carry);
      return nullptr;
    }
    Scratch& sc = ThreadScratch();
    Kept kept =
        block_->AdjointSummaryKeep(std::move(carried), u, Rows(c), g, sc.local.data(), sc.S.data());
    Combine(sc, carry);
    return kept;
  }
  void Backward(Kept kept, const T* u, ChunkSpan c, const T* h0, const T* g, const T* mu,
                T* mu_out, T*, LayerParams<T>& grad, T* du, T* du_halo, T* sum) override {
    if (sum != nullptr) {
      return block_->BackwardInto(u, Rows(c), g, h0, mu, sum, du, du_halo, mu_out);
    }
    block_->BackwardDeferred(std::move(kept), u, Rows(c), g, h0, mu, grad, du, du_halo, mu_out);
  }
  void HaloBackward(const T*, int64_t, const T*, LayerParams<T>&, T*, T*) override {}
  void FinishBackward(LayerParams<T>& grad) override { block_->FinishBackward(grad); }
  int64_t grad_size() const override { return grad_size_; }
  void DownloadGrad(const T* sum, LayerParams<T>& grad) override {
    grad = ZeroLayer();  // sized
    for (std::vector<T>* t : Tensors(grad)) {
      space_->Download(t->data(), sum, t->size());
      sum += t->size();
    }
  }

 private:
  static int64_t LayerValues(const MambaConfig& config) {
    LayerParams<T> zero = adjsh::ZeroLayer<T>(config);
    int64_t n = 0;
    for (std::vector<T>* t : Tensors(zero)) n += static_cast<int64_t>(t->size());
    return n;
  }
  // A layer's tensors in the order of BlockBackend::BackwardInto's sum.
  static std::vector<std::vector<T>*> Tensors(LayerParams<T>& l) {
    return {&l.norm, &l.in_proj, &l.conv_w, &l.conv_b, &l.x_proj,
            &l.dt_w, &l.dt_b,    &l.A_log,  &l.Dskip,  &l.out_proj};
  }
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

  RowSpace<T>* const space_;
  const bool resident_;
  std::unique_ptr<BlockBackend<T>> block_;
  const int64_t grad_size_;
  const MambaConfig& cfg_;
  const int64_t Di_, N_;
  const std::vector<T> A_;
};

}  // namespace

template <typename T>
LayerModel<ModelParams<T>> MakeLayerModel(const ModelParams<T>& params, Backend<T>& backend,
                                          RowPlace place) {
  LayerModel<ModelParams<T>> m;
  m.params = &params;
  m.backend = &backend;
  RowSpace<T>* device = place == RowPlace::kResident ? backend.ResidentRows() : nullptr;
  m.rows = device ? device : &HostRows<T>();
  if (device) {
    m.head = backend.MakeResidentHead(params.embed.data(), params.head().data(),
                                      params.norm_f.data(), params.config.vocab_size,
                                      params.config.hidden_size);
    ADJSH_CHECK(m.head != nullptr, "a backend with resident rows makes a resident head");
  }
  const std::vector<T> A = DecayRates(params);
  const int64_t DiN = params.config.inner() * params.config.state_size;
  for (size_t k = 0; k < params.layers.size(); ++k) {
    const LayerParams<T>& layer = params.layers[k];
    m.layers.push_back(std::make_unique<MambaChunkOps<T>>(
        device ? backend.MakeResidentBlock(params.config, layer)
               : backend.MakeBlock(params.config, layer),
        params.config, std::vector<T>(A.begin() + k * DiN, A.begin() + (k + 1) * DiN),
        *m.rows));
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

template LayerModel<ModelParams<float>> MakeLayerModel(const ModelParams<float>&, Backend<float>&,
                                                       RowPlace);
template LayerModel<ModelParams<double>> MakeLayerModel(const ModelParams<double>&,
                                                        Backend<double>&, RowPlace);
template absl::StatusOr<DeviceModel<ModelParams<float>>> MakeDeviceModel(
    const ModelParams<float>&, const Device&, std::initializer_list<Op>);
template absl::StatusOr<DeviceModel<ModelParams<double>>> MakeDeviceModel(
    const ModelParams<double>&, const Device&, std::initializer_list<Op>);

}  // namespace adjsh
