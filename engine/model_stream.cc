#include "engine/model_stream.h"

#include <utility>

namespace adjsh {

template <typename T>
absl::StatusOr<MambaStreams<T>> MambaStreams<T>::Make(const Params& params, const Device& device,
                                                      bool head) {
  const MambaConfig& c = params.config;
  // Decoding's logits are computed on the host (Backend::HeadLogits): then the layers' forward
  // is all the device must do.
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend =
      head ? MakeBackendFor<T>(device, c, {Op::kForward, Op::kHead})
           : MakeBackendFor<T>(device, c, {Op::kForward});
  if (!backend.ok()) return backend.status();
  MambaStreams s;
  s.backend_ = *std::move(backend);
  s.model_ = BackendModel<T>::Make(params, *s.backend_);
  s.layers_.assign(c.num_hidden_layers,
                   LayerStream<T>(c.hidden_size, c.conv_kernel - 1, c.inner() * c.state_size));
  return s;
}

template <typename T>
absl::StatusOr<Mamba2Streams<T>> Mamba2Streams<T>::Make(const Params& params,
                                                        const Device& device, bool) {
  absl::StatusOr<Mamba2DeviceModel<T>> model = Mamba2DeviceModel<T>::Make(params, device);
  if (!model.ok()) return model.status();
  Mamba2Streams s;
  s.device_ = *std::move(model);
  const Mamba2Dims d(params.config);
  s.D_ = d.D, s.H_ = d.W - 1;
  s.S_.assign(params.config.num_hidden_layers, std::vector<T>(d.H * d.P * d.N, T(0)));
  s.halo_.resize(params.config.num_hidden_layers);
  s.t_.assign(params.config.num_hidden_layers, 0);
  return s;
}

template <typename T>
void Mamba2Streams<T>::Reset() {
  for (auto& S : S_) std::fill(S.begin(), S.end(), T(0));
  for (auto& h : halo_) h.clear();
  std::fill(t_.begin(), t_.end(), 0);
}

template <typename T>
void Mamba2Streams<T>::Advance(int64_t k, T* x, int64_t len, T* out) {
  const int64_t t0 = t_[k], t1 = t0 + len;
  const int64_t rows = static_cast<int64_t>(halo_[k].size()) / D_;  // min(W - 1, t0)
  T* in = x + (H_ - rows) * D_;  // the halo rows, then the piece's
  std::copy(halo_[k].begin(), halo_[k].end(), in);
  device_.model.layers[k]->Forward(in, t0, t1, S_[k].data(), out, nullptr);
  const int64_t keep = std::min(H_, t1);  // the next piece's halo: the last rows read
  halo_[k].assign(in + (rows + len - keep) * D_, in + (rows + len) * D_);
  const T* own = x + H_ * D_;
  for (int64_t i = 0; i < len * D_; ++i) out[i] += own[i];  // the residual
  t_[k] = t1;
}

template class MambaStreams<float>;
template class MambaStreams<double>;
template class Mamba2Streams<float>;
template class Mamba2Streams<double>;

}  // namespace adjsh
