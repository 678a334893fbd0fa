#include "kernels/mamba2_backend.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace adjsh {
namespace {

// One chunk's activations and buffers per thread, not per call or per layer: spans run on
// several threads at once, each through the same layer's ops.
template <typename T>
struct ChunkScratch {
  Mamba2ChunkActs<T> acts;
  std::vector<T> S, out;
};

template <typename T>
ChunkScratch<T>& ThreadChunkScratch() {
  thread_local ChunkScratch<T> s;
  return s;
}

// The CPU's layer: the functions of kernels/cpu/mamba2_layer.h, the activations of Adjoint and
// Backward recomputed by a full forward from S0 (outputs included, as Mamba2ChunkBackward
// reads them).
template <typename T>
class CpuMamba2Ops final : public Mamba2ChunkOps<T> {
 public:
  CpuMamba2Ops(const Mamba2Layer<T>& layer, const Mamba2Config& config)
      : l_(layer), cfg_(config), H_(config.num_heads) {}

  void Forward(const T* u, int64_t t0, int64_t t1, T* S, T* out, T* dt_sum) override {
    ChunkScratch<T>& sc = ThreadChunkScratch<T>();
    Mamba2ChunkForward(l_, cfg_, u, t0, t1, S, sc.acts, out);
    if (dt_sum == nullptr) return;
    for (int64_t i = 0; i < t1 - t0; ++i)
      for (int64_t h = 0; h < H_; ++h) dt_sum[h] += sc.acts.dt[i * H_ + h];
  }
  void Adjoint(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout,
               T* carry) override {
    Mamba2ChunkAdjoint(l_, cfg_, Recompute(u, t0, t1, S0), dout, carry);
  }
  void Backward(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout, T* carry,
                T* halo, Mamba2Layer<T>& grad, T* du) override {
    Mamba2ChunkBackward(l_, cfg_, u, Recompute(u, t0, t1, S0), dout, carry, halo, grad, du);
  }
  void HaloBackward(const T* u, int64_t t0, const T* halo, Mamba2Layer<T>& grad,
                    T* du) override {
    Mamba2HaloBackward(l_, cfg_, u, t0, halo, grad, du);
  }

 private:
  const Mamba2ChunkActs<T>& Recompute(const T* u, int64_t t0, int64_t t1, const T* S0) {
    ChunkScratch<T>& sc = ThreadChunkScratch<T>();
    const int64_t HPN = H_ * cfg_.head_dim * cfg_.state_size;
    sc.S.assign(S0, S0 + HPN);
    sc.out.resize((t1 - t0) * cfg_.hidden_size);
    Mamba2ChunkForward(l_, cfg_, u, t0, t1, sc.S.data(), sc.acts, sc.out.data());
    return sc.acts;
  }

  const Mamba2Layer<T>& l_;
  const Mamba2Config& cfg_;
  const int64_t H_;
};

// A device's layer (kernels/backend.h Mamba2BlockBackend): the gradient as its pointers.
template <typename T>
class DeviceMamba2Ops final : public Mamba2ChunkOps<T> {
 public:
  explicit DeviceMamba2Ops(std::unique_ptr<Mamba2BlockBackend<T>> block)
      : block_(std::move(block)) {}

  void Forward(const T* u, int64_t t0, int64_t t1, T* S, T* out, T* dt_sum) override {
    block_->Forward(u, t0, t1, S, out, dt_sum);
  }
  void Adjoint(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout,
               T* carry) override {
    block_->Adjoint(u, t0, t1, S0, dout, carry);
  }
  void Backward(const T* u, int64_t t0, int64_t t1, const T* S0, const T* dout, T* carry,
                T* halo, Mamba2Layer<T>& grad, T* du) override {
    block_->Backward(u, t0, t1, S0, dout, carry, halo, Mamba2TensorsOf<T>(grad), du);
  }
  void HaloBackward(const T* u, int64_t t0, const T* halo, Mamba2Layer<T>& grad,
                    T* du) override {
    block_->HaloBackward(u, t0, halo, Mamba2TensorsOf<T>(grad), du);
  }

 private:
  std::unique_ptr<Mamba2BlockBackend<T>> block_;
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
absl::StatusOr<Mamba2BackendModel<T>> Mamba2BackendModel<T>::Make(const Mamba2Params<T>& params,
                                                                  Backend<T>& backend) {
  if (absl::Status s = CheckMamba2Backend(backend, false); !s.ok()) return s;
  Mamba2BackendModel<T> m;
  m.params = &params;
  m.backend = &backend;
  const Device& device = backend.device();
  for (const Mamba2Layer<T>& l : params.layers) {
    if (device.is_cpu()) {
      m.layers.push_back(std::make_unique<CpuMamba2Ops<T>>(l, params.config));
      continue;
    }
    std::unique_ptr<Mamba2BlockBackend<T>> block =
        backend.MakeMamba2Block(params.config, Mamba2TensorsOf<const T>(l));
    if (!block) {
      return absl::UnimplementedError(absl::StrCat(std::string(OpName(Op::kMamba2Layer)),
                                                   " is not supported on ", device.ToString()));
    }
    m.layers.push_back(std::make_unique<DeviceMamba2Ops<T>>(std::move(block)));
  }
  return m;
}

template <typename T>
absl::StatusOr<Mamba2DeviceModel<T>> Mamba2DeviceModel<T>::Make(const Mamba2Params<T>& params,
                                                                const Device& device,
                                                                bool loss_mask) {
  Mamba2DeviceModel<T> m;
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend = MakeBackend<T>(device);
  if (!backend.ok()) return backend.status();
  m.backend = *std::move(backend);
  if (absl::Status s = CheckMamba2Backend(*m.backend, loss_mask); !s.ok()) return s;
  absl::StatusOr<Mamba2BackendModel<T>> model = Mamba2BackendModel<T>::Make(params, *m.backend);
  if (!model.ok()) return model.status();
  m.model = *std::move(model);
  return m;
}

template absl::Status CheckMamba2Backend<float>(const Backend<float>&, bool);
template absl::Status CheckMamba2Backend<double>(const Backend<double>&, bool);
template struct Mamba2BackendModel<float>;
template struct Mamba2BackendModel<double>;
template struct Mamba2DeviceModel<float>;
template struct Mamba2DeviceModel<double>;

}  // namespace adjsh
