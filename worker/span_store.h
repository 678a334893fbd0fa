// What a worker keeps between the tasks it pulls, per job: the newest parameter version's model
// on the worker's backend, the plans of that version's step (one per sequence of the step: a
// batch's sequences run at once, proto/adjsh.proto Task.sequence), and the spans it owns there
// (engine/span_work.h), by (sequence, span). A task of a newer version drops all of it first (a
// new step: new parameters, and every span starts again from its tokens). At most max_jobs jobs
// are kept, the least recently used dropped. The model's part is one model type's
// (engine/families/family.h), chosen by the config's model_type. Main thread only.
#ifndef ADJSH_WORKER_SPAN_STORE_H_
#define ADJSH_WORKER_SPAN_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/families/families.h"
#include "engine/reduce_groups.h"
#include "engine/span_plan.h"
#include "proto/adjsh.pb.h"

namespace adjsh::worker {

// The plan of the task's sequence, when the task fits its config and the plan can be made:
// layer in 0..K-1, span in 0..spans-1, sequence in 0..sequences-1, T >= 2, chunk >= 1,
// targets >= 1, storage "full" or "bf16", dtype F32. INVALID_ARGUMENT saying what does not fit
// otherwise. K layers, conv kernel W: the config's.
absl::StatusOr<SpanPlan> CheckTask(const v1::Task& task, int64_t K, int64_t W);

// One model type's part of a job (F: engine/families/family.h): its config, the parameters
// of the job's version (null until fetched), them on the backend, and the spans owned, by
// (sequence, span). Members in the order they are dropped in reverse: the spans point into the
// model, the model into the parameters.
template <typename F>
struct JobModel {
  using ModelFamily = F;
  std::shared_ptr<const typename F::Config> config;
  std::unique_ptr<typename F::template Params<float>> params;
  std::unique_ptr<typename F::template Model<float>> model;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<typename F::template Work<float>>> spans;

  void DropSpans(int64_t b) {  // of sequence b, or of every sequence (b < 0)
    if (b < 0) spans.clear();
    else spans.erase(spans.lower_bound({b, 0}), spans.lower_bound({b + 1, 0}));
  }
  void DropModel() {  // a new version: spans, then the model, then its parameters
    spans.clear();
    model.reset();
    params.reset();
  }
  int64_t kept_bytes() const {
    int64_t b = 0;
    for (const auto& [s, w] : spans) b += w->kept_bytes();
    return b;
  }
};

class SpanStore {
 public:
  struct Job {
    std::string config_json;
    uint64_t version = 0;
    // Of `version`'s step, by sequence.
    std::map<int64_t, std::unique_ptr<SpanPlan>> plans;
    // The model type's part, one alternative per family (engine/families/families.h); after
    // the plans, which its spans point into.
    EachFamily<JobModel> model;
    uint64_t last_used = 0;
    // The wire form of a worker tree's groups for the config (engine/reduce_groups.h).
    std::shared_ptr<const GroupLayout> groups;
    // Drops every span of sequence b (its plan changed), or of every sequence (b < 0).
    void DropSpans(int64_t b) {
      std::visit([b](auto& m) { m.DropSpans(b); }, model);
    }
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
