// What the tasks of one job share, cached on the worker so that a layer's parameters are
// fetched once per params_version rather than once per task: the parsed config and the layers'
// parameters, per compute type. Also the checks of a task against its config, and the
// conversion of the received parameter tensors to LayerParams. Main thread only.
//   - Parameters are kept for the newest params_version only (older ones are evicted when a
//     newer version arrives; a task of an older version fetches without caching).
//   - At most max_jobs jobs are kept, the least recently used evicted.
//
//   ParamCache cache(4);
//   absl::StatusOr<ParamCache::Job*> job = cache.JobFor(task);
//   auto params = (*job)->Find<float>(task.params_version(), k);  // null: fetch, then Keep
#ifndef ADJSH_WORKER_PARAM_CACHE_H_
#define ADJSH_WORKER_PARAM_CACHE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/model.h"
#include "common/safetensors.h"
#include "proto/adjsh.pb.h"
#include "worker/task_io.h"

namespace adjsh::worker {

// OK when the task's chunk fits its config: layer in 0..K-1, 1 <= len <= 2^32, halo =
// min(W - 1, t0), and within the context length when one is given. INVALID_ARGUMENT saying
// what does not fit otherwise.
absl::Status CheckTask(const v1::Task& task, const MambaConfig& cfg);

// Layer k's parameters as FetchInputs sends them: HF names and shapes, LayerParamSlots order.
template <typename T>
std::vector<Expected> LayerParamTensors(const MambaConfig& cfg, int64_t k);

// Moves all of them (`names`: LayerParamTensors) out of `got`, converted (TakeTensor).
template <typename T>
absl::StatusOr<std::shared_ptr<const LayerParams<T>>> TakeLayerParams(
    TensorMap& got, const std::vector<Expected>& names);

class ParamCache {
 public:
  // One job's cached config and parameters (newest params_version only), per compute type.
  class Job {
   public:
    // The parsed config; tasks hold it while they run.
    const std::shared_ptr<const MambaConfig>& config() const { return config_; }
    // Layer k's parameters for a task of params_version `version`, or null when not cached.
    // A version newer than the cached one evicts every layer first.
    template <typename T>
    std::shared_ptr<const LayerParams<T>> Find(uint64_t version, int64_t k);
    // Caches layer k's parameters when `version` is the newest seen (else they are not kept).
    template <typename T>
    void Keep(uint64_t version, int64_t k, std::shared_ptr<const LayerParams<T>> params);

   private:
    friend class ParamCache;
    template <typename T>
    using Layers = std::map<int64_t, std::shared_ptr<const LayerParams<T>>>;  // by layer

    std::string config_json_;
    std::shared_ptr<const MambaConfig> config_;
    bool has_version_ = false;
    uint64_t params_version_ = 0;
    std::tuple<Layers<float>, Layers<double>> layers_;
    uint64_t last_used_ = 0;
  };

  explicit ParamCache(int max_jobs) : max_jobs_(max_jobs) {}

  // The task's job, made (again, when its config_json changed) from task.config_json; it
  // becomes the most recently used. The config parser's error for a bad config_json.
  absl::StatusOr<Job*> JobFor(const v1::Task& task);

 private:
  const int max_jobs_;
  std::map<std::string, Job> jobs_;  // by job id
  uint64_t clock_ = 0;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_PARAM_CACHE_H_
