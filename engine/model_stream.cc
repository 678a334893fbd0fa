#include "engine/model_stream.h"

#include <utility>

#include "common/mamba2_model.h"
#include "common/model.h"
#include "kernels/mamba2_chunk_ops.h"
#include "kernels/mamba_chunk_ops.h"

namespace adjsh {
namespace {

// Decoding's logits are computed on the host (Backend::HeadLogits): then the layers' forward is
// all the device must do.
template <typename T>
absl::StatusOr<DeviceModel<ModelParams<T>>> StreamModel(const ModelParams<T>& params,
                                                        const Device& device, bool head) {
  return head ? MakeDeviceModel(params, device, {Op::kForward, Op::kHead})
              : MakeDeviceModel(params, device, {Op::kForward});
}
template <typename T>
absl::StatusOr<DeviceModel<Mamba2Params<T>>> StreamModel(const Mamba2Params<T>& params,
                                                         const Device& device, bool) {
  return MakeDeviceModel(params, device);  // a Mamba-2 layer and the head (CheckMamba2Backend)
}

}  // namespace

template <typename P>
absl::StatusOr<ModelStreams<P>> ModelStreams<P>::Make(const Params& params,
                                                                const Device& device, bool head) {
  absl::StatusOr<DeviceModel<P>> model = StreamModel(params, device, head);
  if (!model.ok()) return model.status();
  ModelStreams s;
  s.device_ = *std::move(model);
  const auto& c = params.config;
  const int64_t S = s.device_.model.layers.front()->state_size();
  s.layers_.assign(c.num_hidden_layers,
                   LayerStream<Value, Layer>(c.hidden_size, c.conv_kernel - 1, S));
  return s;
}

template class ModelStreams<ModelParams<float>>;
template class ModelStreams<ModelParams<double>>;
template class ModelStreams<Mamba2Params<float>>;
template class ModelStreams<Mamba2Params<double>>;

}  // namespace adjsh
