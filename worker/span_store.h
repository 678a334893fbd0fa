// What a worker keeps between the tasks it pulls, per job: the newest parameter version's model
// on the worker's backend, the plans of that version's step (one per sequence of the step: a
// batch's sequences run at once, proto/adjsh.proto Task.sequence), and the spans it owns there
// (engine/span_work.h), by (sequence, span). A task of a newer version drops all of it first (a
// new step: new parameters, and every span starts again from its tokens). At most max_jobs jobs
// are kept, the least recently used dropped. A Mamba-2 model's job keeps the same in its
// mamba2 members. Main thread only.
#ifndef ADJSH_WORKER_SPAN_STORE_H_
#define ADJSH_WORKER_SPAN_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/mamba2_config.h"
#include "common/model.h"
#include "kernels/mamba2_backend.h"
#include "common/mamba2_model.h"
#include "engine/mamba2_span_work.h"
#include "engine/reduce_groups.h"
#include "engine/span_plan.h"
#include "engine/span_work.h"
#include "proto/adjsh.pb.h"

namespace adjsh::worker {

// The plan of the task's sequence, when the task fits its config and the plan can be made:
// layer in 0..K-1, span in 0..spans-1, sequence in 0..sequences-1, T >= 2, chunk >= 1,
// targets >= 1, storage "full" or "bf16", dtype F32. INVALID_ARGUMENT saying what does not fit
// otherwise. K layers, conv kernel W: the config's.
absl::StatusOr<SpanPlan> CheckTask(const v1::Task& task, int64_t K, int64_t W);

class SpanStore {
 public:
  // A job of a Mamba-1 model (config set) or of a Mamba-2 one (mamba2 set, by the config's
  // model_type "mamba2"); the other's members stay empty.
  struct Job {
    std::string config_json;
    std::shared_ptr<const MambaConfig> config;
    uint64_t version = 0;
    std::unique_ptr<ModelParams<float>> params;   // null until fetched for `version`
    std::unique_ptr<BackendModel<float>> model;   // params on the backend
    // Of `version`'s step, by sequence.
    std::map<int64_t, std::unique_ptr<SpanPlan>> plans;
    // The spans owned, by (sequence, span).
    std::map<std::pair<int64_t, int64_t>, std::unique_ptr<SpanWork<float>>> spans;
    uint64_t last_used = 0;
    // Mamba-2 (engine/mamba2_span_work.h): its config, parameters (null until fetched) and
    // spans, as above.
    std::shared_ptr<const Mamba2Config> mamba2;
    std::unique_ptr<Mamba2Params<float>> mamba2_params;
    std::unique_ptr<Mamba2BackendModel<float>> mamba2_model;  // mamba2_params on the backend
    std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Mamba2SpanWork<float>>> mamba2_spans;
    // The wire form of a worker tree's groups for either config (engine/reduce_groups.h).
    std::shared_ptr<const GroupLayout> groups;
    // Drops every span of sequence b (its plan changed), or of every sequence (b < 0).
    void DropSpans(int64_t b);
  };

  explicit SpanStore(int max_jobs) : max_jobs_(max_jobs) {}

  // The task's job, at the task's version, with the plan of the task's sequence: made (again)
  // from its config_json (Mamba-1's, or Mamba-2's by its model_type) and plan when those or
  // the version changed (a changed plan drops that sequence's spans only).
  // FAILED_PRECONDITION for a task older than the version held (a stale task); the config
  // parser's or the plan's error for a bad task.
  absl::StatusOr<Job*> JobFor(const v1::Task& task);

  int64_t kept_bytes() const;  // every span's rows, for logs

 private:
  const int max_jobs_;
  std::map<std::string, Job> jobs_;  // by job id
  uint64_t clock_ = 0;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_SPAN_STORE_H_
