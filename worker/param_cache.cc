#include "worker/param_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/strings.h"

namespace adjsh::worker {

absl::Status CheckTask(const v1::Task& task, const MambaConfig& cfg) {
  const int64_t K = cfg.num_hidden_layers, W = cfg.conv_kernel;
  const int64_t k = task.layer(), halo = task.halo(), len = task.len(), t0 = task.t0();
  if (k < 0 || k >= K) {
    return absl::InvalidArgumentError(absl::StrFormat("layer %d outside 0..%d", k, K - 1));
  }
  if (len < 1 || len > (int64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrFormat("bad len %d", len));
  }
  if (t0 < 0 || halo != std::min(W - 1, t0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("halo %d is not min(W - 1 = %d, t0 = %d)", halo, W - 1, t0));
  }
  if (task.context_length() > 0 && t0 + len > task.context_length()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chunk [%d, %d) past the context length %d", t0, t0 + len, task.context_length()));
  }
  return absl::OkStatus();
}

template <typename T>
std::vector<Expected> LayerParamTensors(const MambaConfig& cfg, int64_t k) {
  std::vector<Expected> names;
  for (const LayerParamSlot<T>& slot : LayerParamSlots<T>()) {
    names.push_back({LayerParamName(k, slot.suffix), slot.shape(cfg)});
  }
  return names;
}

template <typename T>
absl::StatusOr<std::shared_ptr<const LayerParams<T>>> TakeLayerParams(
    TensorMap& got, const std::vector<Expected>& names) {
  auto params = std::make_shared<LayerParams<T>>();
  const auto& slots = LayerParamSlots<T>();
  for (size_t i = 0; i < slots.size(); ++i) {
    absl::Status st = TakeTensor(got, names[i], (*params).*slots[i].member);
    if (!st.ok()) return st;
  }
  return std::shared_ptr<const LayerParams<T>>(std::move(params));
}

template <typename T>
std::shared_ptr<const LayerParams<T>> ParamCache::Job::Find(uint64_t version, int64_t k) {
  if (!has_version_ || version > params_version_) {
    std::get<Layers<float>>(layers_).clear();
    std::get<Layers<double>>(layers_).clear();
    has_version_ = true;
    params_version_ = version;
  }
  if (version != params_version_) return nullptr;
  const Layers<T>& layers = std::get<Layers<T>>(layers_);
  auto it = layers.find(k);
  return it != layers.end() ? it->second : nullptr;
}

template <typename T>
void ParamCache::Job::Keep(uint64_t version, int64_t k,
                           std::shared_ptr<const LayerParams<T>> params) {
  if (version == params_version_) std::get<Layers<T>>(layers_)[k] = std::move(params);
}

#define ADJSH_INSTANTIATE(T)                                                                   \
  template std::vector<Expected> LayerParamTensors<T>(const MambaConfig&, int64_t);            \
  template absl::StatusOr<std::shared_ptr<const LayerParams<T>>> TakeLayerParams<T>(           \
      TensorMap&, const std::vector<Expected>&);                                               \
  template std::shared_ptr<const LayerParams<T>> ParamCache::Job::Find<T>(uint64_t, int64_t);  \
  template void ParamCache::Job::Keep<T>(uint64_t, int64_t,                                    \
                                         std::shared_ptr<const LayerParams<T>>);
ADJSH_INSTANTIATE(float)
ADJSH_INSTANTIATE(double)
#undef ADJSH_INSTANTIATE

absl::StatusOr<ParamCache::Job*> ParamCache::JobFor(const v1::Task& task) {
  auto it = jobs_.find(task.job_id());
  if (it == jobs_.end() || it->second.config_json_ != task.config_json()) {
    absl::StatusOr<MambaConfig> config = ParseConfigJson(ToStd(task.config_json()));
    if (!config.ok()) return config.status();
    Job fresh;
    fresh.config_json_ = task.config_json();
    fresh.config_ = std::make_shared<const MambaConfig>(*config);
    it = jobs_.insert_or_assign(task.job_id(), std::move(fresh)).first;
  }
  it->second.last_used_ = ++clock_;
  while (jobs_.size() > static_cast<size_t>(max_jobs_)) {
    auto oldest = jobs_.begin();
    for (auto j = jobs_.begin(); j != jobs_.end(); ++j) {
      if (j->second.last_used_ < oldest->second.last_used_) oldest = j;
    }
    jobs_.erase(oldest);  // never `it`: it was just used
  }
  return &it->second;
}

}  // namespace adjsh::worker
