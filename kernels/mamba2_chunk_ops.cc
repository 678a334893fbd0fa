#include "kernels/mamba2_chunk_ops.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kernels/cpu/mamba2_layer.h"
#include "kernels/mamba2_tensors.h"

namespace adjsh {
namespace {

// One chunk's activations and buffers per thread, not per call or per layer: spans run on
// several threads at once, each through the same layer's ops.
template <typename T>
struct ChunkScratch {
  Mamba2ChunkActs<T> acts;
  std::vector<T> S, out, dt;
};

template <typename T>
ChunkScratch<T>& ThreadChunkScratch() {
  thread_local ChunkScratch<T> s;
  return s;
}

// The op table over a layer's four chunk functions (the contracts of kernels/backend.h
// Mamba2BlockBackend): the CPU's or a device's. Its own copies and sums between them go through
// the row space its pointers are in (the host's, or a resident device's).
template <typename T>
class Mamba2Ops : public ChunkOps<T, Mamba2Layer<T>> {
 public:
  using Kept = std::unique_ptr<KeptActs>;

  Mamba2Ops(const Mamba2Config& config, RowSpace<T>& space)
      : cfg_(config), d_(config), space_(space) {}

  int64_t state_size() const override { return d_.H * d_.P * d_.N; }
  int64_t sigma_size() const override { return d_.Di; }
  bool keeps_chunk_states() const override { return false; }
  HaloGrad halo_grad() const override { return HaloGrad::kCarried; }
  int64_t conv_carry_size() const override { return (d_.W - 1) * d_.Cc; }
  Mamba2Layer<T> ZeroLayer() const override {
    Mamba2Layer<T> l;
    for (const Mamba2LayerSlot<T>& slot : Mamba2LayerSlots<T>())
      (l.*slot.member).assign(ShapeNumel(slot.shape(cfg_)), T(0));
    return l;
  }

  // sigma repeats each head's dt sum over its P channels: the running sum is read back from
  // the head's first channel, so the rows add up in row order over the whole span.
  Kept FoldForward(const T* u, ChunkSpan c, T* state, T* sigma) override {
    if (!space_.host()) {  // resident: the block adds each head's dt into sigma itself
      FoldChunk(u, c.t0, c.t0 + c.len, state, sigma);
      return nullptr;
    }
    std::vector<T>& dt = ThreadChunkScratch<T>().dt;
    dt.resize(d_.H);
    for (int64_t h = 0; h < d_.H; ++h) dt[h] = sigma[h * d_.P];
    ChunkForward(u, c.t0, c.t0 + c.len, state, nullptr, dt.data());
    for (int64_t h = 0; h < d_.H; ++h) std::fill_n(sigma + h * d_.P, d_.P, dt[h]);
    return nullptr;
  }
  Kept Forward(Kept, const T* u, ChunkSpan c, const T* h0, T* out, T* h_end,
               int64_t) override {
    if (h0 == nullptr) {
      space_.Zero(h_end, state_size());
    } else if (h0 != h_end) {
      space_.Copy(h_end, h0, state_size());
    }
    ChunkForward(u, c.t0, c.t0 + c.len, h_end, out, nullptr);
    if (out == nullptr) return nullptr;
    // The residual: the chunk's own input rows.
    space_.Add(out, u + c.halo * d_.D, c.len * d_.D);
    return nullptr;
  }
  Kept FoldAdjoint(Kept, const T* u, ChunkSpan c, const T* h0, const T* g, T* carry) override {
    ChunkAdjoint(u, c.t0, c.t0 + c.len, h0, g, carry);
    return nullptr;
  }
  void Backward(Kept, const T* u, ChunkSpan c, const T* h0, const T* g, const T* mu, T* mu_out,
                T* conv_carry, Mamba2Layer<T>& grad, T* du, T*, T* sum) override {
    if (mu == nullptr) {
      space_.Zero(mu_out, state_size());
    } else if (mu != mu_out) {
      space_.Copy(mu_out, mu, state_size());
    }
    ChunkBackward(u, c.t0, c.t0 + c.len, h0, g, mu_out, conv_carry, grad, du, sum);
  }

 protected:
  // Forward: S the states before t0 in, after out; out (L, D) the layer's addition or null;
  // dt_sum (H) added to, or null. Adjoint, Backward, HaloBackward: kernels/cpu/mamba2_layer.h.
  virtual void ChunkForward(const T* u, int64_t t0, int64_t t1, T* S, T* out, T* dt_sum) = 0;
  virtual void ChunkAdjoint(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout,
                            T* carry) = 0;
  // sum: a resident model's device sum (ChunkOps::grad_size), else null.
  virtual void ChunkBackward(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout,
                             T* carry, T* halo, Mamba2Layer<T>& grad, T* du, T* sum) = 0;
  // A resident layer's forward summary: the states alone, each head's dt added into sigma.
  virtual void FoldChunk(const T*, int64_t, int64_t, T*, T*) {
    ADJSH_CHECK(false, "FoldChunk of a layer of host rows");
  }

  const Mamba2Config& cfg_;
  const Mamba2Dims d_;
  RowSpace<T>& space_;
};

// The CPU's layer: the functions of kernels/cpu/mamba2_layer.h, the activations of Adjoint and
// Backward recomputed by a full forward from S0 (outputs included, as Mamba2ChunkBackward
// reads them).
template <typename T>
class CpuMamba2Ops final : public Mamba2Ops<T> {
 public:
  CpuMamba2Ops(const Mamba2Layer<T>& layer, const Mamba2Config& config)
      : Mamba2Ops<T>(config, HostRows<T>()), l_(layer) {}

  void HaloBackward(const T* u, int64_t t0, const T* halo, Mamba2Layer<T>& grad, T* du,
                    T*) override {
    Mamba2HaloBackward(l_, this->cfg_, u, t0, halo, grad, du);
  }
  void FinishBackward(Mamba2Layer<T>&) override {}  // every call added into grad at once

 private:
  void ChunkForward(const T* u, int64_t t0, int64_t t1, T* S, T* out, T* dt_sum) override {
    ChunkScratch<T>& sc = ThreadChunkScratch<T>();
    Mamba2ChunkForward(l_, this->cfg_, u, t0, t1, S, sc.acts, out);
    if (dt_sum == nullptr) return;
    const int64_t H = this->d_.H;
    for (int64_t i = 0; i < t1 - t0; ++i)
      for (int64_t h = 0; h < H; ++h) dt_sum[h] += sc.acts.dt[i * H + h];
  }
  void ChunkAdjoint(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout,
                    T* carry) override {
    Mamba2ChunkAdjoint(l_, this->cfg_, Recompute(u, t0, t1, S0), dout, carry);
  }
  void ChunkBackward(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout, T* carry,
                     T* halo, Mamba2Layer<T>& grad, T* du, T*) override {
    Mamba2ChunkBackward(l_, this->cfg_, u, Recompute(u, t0, t1, S0), dout, carry, halo, grad,
                        du);
  }
  const Mamba2ChunkActs<T>& Recompute(const T* u, int64_t t0, int64_t t1, const T* S0) {
    ChunkScratch<T>& sc = ThreadChunkScratch<T>();
    sc.S.assign(S0, S0 + this->state_size());
    sc.out.resize((t1 - t0) * this->cfg_.hidden_size);
    Mamba2ChunkForward(l_, this->cfg_, u, t0, t1, sc.S.data(), sc.acts, sc.out.data());
    return sc.acts;
  }

  const Mamba2Layer<T>& l_;
};

// A device's layer (kernels/backend.h Mamba2BlockBackend): the gradient as its pointers, or for
// a resident layer (its rows in the device's space) a device sum.
template <typename T>
class DeviceMamba2Ops final : public Mamba2Ops<T> {
 public:
  DeviceMamba2Ops(std::unique_ptr<Mamba2BlockBackend<T>> block, const Mamba2Config& config,
                  RowSpace<T>& space)
      : Mamba2Ops<T>(config, space), block_(std::move(block)) {
    Mamba2Layer<T> zero = this->ZeroLayer();
    for (std::vector<T>* t : Tensors(zero))
      grad_size_ += space.host() ? 0 : static_cast<int64_t>(t->size());
  }

  void HaloBackward(const T* u, int64_t t0, const T* halo, Mamba2Layer<T>& grad, T* du,
                    T* sum) override {
    if (sum != nullptr) return block_->HaloBackwardInto(u, t0, halo, sum, du);
    block_->HaloBackward(u, t0, halo, Mamba2TensorsOf<T>(grad), du);
  }
  void FinishBackward(Mamba2Layer<T>& grad) override {
    block_->FinishBackward(Mamba2TensorsOf<T>(grad));
  }
  int64_t grad_size() const override { return grad_size_; }
  void DownloadGrad(const T* sum, Mamba2Layer<T>& grad) override {
    grad = this->ZeroLayer();  // sized
    for (std::vector<T>* t : Tensors(grad)) {
      this->space_.Download(t->data(), sum, t->size());
      sum += t->size();
    }
  }

 private:
  void ChunkForward(const T* u, int64_t t0, int64_t t1, T* S, T* out, T* dt_sum) override {
    block_->Forward(u, t0, t1, S, out, dt_sum);
  }
  void ChunkAdjoint(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout,
                    T* carry) override {
    block_->Adjoint(u, t0, t1, S0, dout, carry);
  }
  void ChunkBackward(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout, T* carry,
                     T* halo, Mamba2Layer<T>& grad, T* du, T* sum) override {
    if (sum != nullptr) return block_->BackwardInto(u, t0, t1, S0, dout, carry, halo, sum, du);
    block_->Backward(u, t0, t1, S0, dout, carry, halo, Mamba2TensorsOf<T>(grad), du);
  }
  void FoldChunk(const T* u, int64_t t0, int64_t t1, T* S, T* sigma) override {
    block_->FoldForward(u, t0, t1, S, sigma);
  }
  // A layer's tensors in Mamba2Tensors order (the device sum's).
  static std::vector<std::vector<T>*> Tensors(Mamba2Layer<T>& l) {
    return {&l.norm, &l.in_proj, &l.conv_w, &l.conv_b,  &l.dt_bias,
            &l.A_log, &l.D,      &l.gnorm,  &l.out_proj};
  }

  std::unique_ptr<Mamba2BlockBackend<T>> block_;
  int64_t grad_size_ = 0;  // resident: the layer's values; else 0
};

}  // namespace

template <typename T>
absl::Status CheckMamba2Backend(const Backend<T>& backend, bool loss_mask) {
  if (absl::Status s = backend.Require(Op::kMamba2Layer); !s.ok()) return s;
  const Device& device = backend.device();
  if (device.bf16_storage) {  // the GPU's Mamba-2 layer keeps f32 (kernels/cuda/mamba2_block.h)
    return absl::UnimplementedError(absl::StrCat(
        "a Mamba-2 layer with bf16 storage is not supported on ", device.ToString(),
        " (its layer keeps f32)"));
  }
  if (absl::Status s = backend.Require(Op::kHead); !s.ok()) return s;
  return loss_mask ? backend.Require(Op::kHeadAccuracy) : absl::OkStatus();
}

template <typename T>
absl::StatusOr<LayerModel<Mamba2Params<T>>> MakeLayerModel(const Mamba2Params<T>& params,
                                                           Backend<T>& backend, RowPlace place) {
  if (absl::Status s = CheckMamba2Backend(backend, false); !s.ok()) return s;
  LayerModel<Mamba2Params<T>> m;
  m.params = &params;
  m.backend = &backend;
  RowSpace<T>* resident = place == RowPlace::kResident ? backend.ResidentRows() : nullptr;
  m.rows = resident ? resident : &HostRows<T>();
  if (resident) {
    m.head = backend.MakeResidentHead(params.embed.data(), params.head().data(),
                                      params.norm_f.data(), params.config.vocab_size,
                                      params.config.hidden_size);
    ADJSH_CHECK(m.head != nullptr, "a backend with resident rows makes a resident head");
  }
  const Device& device = backend.device();
  for (const Mamba2Layer<T>& l : params.layers) {
    if (device.is_cpu()) {
      m.layers.push_back(std::make_unique<CpuMamba2Ops<T>>(l, params.config));
      continue;
    }
    std::unique_ptr<Mamba2BlockBackend<T>> block =
        resident ? backend.MakeResidentMamba2Block(params.config, Mamba2TensorsOf<const T>(l))
                 : backend.MakeMamba2Block(params.config, Mamba2TensorsOf<const T>(l));
    if (!block) {
      return absl::UnimplementedError(absl::StrCat(std::string(OpName(Op::kMamba2Layer)),
                                                   " is not supported on ", device.ToString()));
    }
    m.layers.push_back(
        std::make_unique<DeviceMamba2Ops<T>>(std::move(block), params.config, *m.rows));
  }
  return m;
}

template <typename T>
absl::StatusOr<DeviceModel<Mamba2Params<T>>> MakeDeviceModel(const Mamba2Params<T>& params,
                                                             const Device& device,
                                                             bool loss_mask, RowPlace place) {
  DeviceModel<Mamba2Params<T>> m;
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend = MakeBackend<T>(device);
  if (!backend.ok()) return backend.status();
  m.backend = *std::move(backend);
  if (absl::Status s = CheckMamba2Backend(*m.backend, loss_mask); !s.ok()) return s;
  absl::StatusOr<LayerModel<Mamba2Params<T>>> model = MakeLayerModel(params, *m.backend, place);
  if (!model.ok()) return model.status();
  m.model = *std::move(model);
  return m;
}

template absl::Status CheckMamba2Backend<float>(const Backend<float>&, bool);
template absl::Status CheckMamba2Backend<double>(const Backend<double>&, bool);
template absl::StatusOr<LayerModel<Mamba2Params<float>>> MakeLayerModel(
    const Mamba2Params<float>&, Backend<float>&, RowPlace);
template absl::StatusOr<LayerModel<Mamba2Params<double>>> MakeLayerModel(
    const Mamba2Params<double>&, Backend<double>&, RowPlace);
template absl::StatusOr<DeviceModel<Mamba2Params<float>>> MakeDeviceModel(
    const Mamba2Params<float>&, const Device&, bool, RowPlace);
template absl::StatusOr<DeviceModel<Mamba2Params<double>>> MakeDeviceModel(
    const Mamba2Params<double>&, const Device&, bool, RowPlace);

}  // namespace adjsh
