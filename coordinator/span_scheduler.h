// One span-scheduled sequence of a gradient step on the coordinator (docs/ARCHITECTURE.md "A
// step through workers"): its plan, its ledger (engine/span_ledger.h), its task queue, who owns
// which span, and what each task cost. A step of a batch has one per sequence, all sharing one
// SpanOwners (sequence b's span s is entry span_base + s). The sequence is of either model type:
// a Mamba-1 or a Mamba-2 model's ledger (engine/families/mamba2.h), the same tasks. The TaskService
// calls it under its own lock; nothing here locks.
//
// Ownership: a span's tasks go to its owner only. At a step's start (DealSpans) the owners that
// live keep their spans (trimmed to the quota ceil(spans of the step / live workers), so that a
// late worker gets its share) and the others are dealt round-robin to the live workers. During
// the step a worker with no ready task of its own spans claims an unowned span's ready task if
// it owns fewer than the quota. An owner not heard from for a lease loses its spans (their
// leased tasks expire with the lease), and whoever claims them next rebuilds them from the
// tokens and the ledger's summaries (SpanLedger::Replay). With the worker tree
// (ReduceAmongWorkers) the owners are fixed for the step: nobody claims, and the TaskService
// begins a step that lost one again.
#ifndef ADJSH_COORDINATOR_SPAN_SCHEDULER_H_
#define ADJSH_COORDINATOR_SPAN_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model.h"
#include "common/safetensors.h"
#include "engine/mamba2_grad.h"
#include "common/mamba2_model.h"
#include "coordinator/task_queue.h"
#include "engine/families/families.h"
#include "engine/span_ledger.h"
#include "engine/span_plan.h"
#include "engine/span_tensors.h"
#include "engine/step_profile.h"

namespace adjsh::coordinator {

// Who owns span s (worker id, "" for none), kept by the service across steps of one shape:
// every span of every sequence of the step, sequence after sequence.
struct SpanOwners {
  std::string job_id;
  int64_t spans = 0;
  std::vector<std::string> owner;
};

// Starts a step of `spans` spans in all with `owners` (reset when they were for another job or
// span count) and the live workers.
void DealSpans(SpanOwners& owners, const std::string& job_id, int64_t spans,
               const std::vector<std::string>& live_workers);

// A sequence's model of the family F (engine/families/) and its ledger.
template <typename F>
struct SequenceModel {
  using Params = typename F::template Params<float>;
  const Params* params = nullptr;
  std::unique_ptr<LedgerOf<Params>> ledger;
};

class SpanScheduler {
 public:
  using Live = std::function<bool(const std::string& worker_id)>;

  // A checked result of the sequence's model type's task (CheckResult), for Apply.
  template <typename F>
  using ResultOf = SpanResultOf<float, typename F::Config>;
  struct Result {
    EachFamily<ResultOf> value;
    double rebuild_seconds = 0;
  };

  // Validated inputs (ValidateGradientInputs); params, tokens and options.loss_mask outlive it.
  // Params: ModelParams<float> or Mamba2Params<float> (the same tasks, ledger and worker tree
  // for either model type, its layer groups under its own tensors' names).
  template <typename Params>
  static absl::StatusOr<std::unique_ptr<SpanScheduler>> Make(const Params& params,
                                                             std::span<const uint32_t> tokens,
                                                             const GradOptions& options);

  // Starts the sequence with `owners` (dealt by DealSpans), its spans from span_base on.
  void Begin(SpanOwners& owners, int64_t span_base);

  // The next ready task of `worker`'s own spans, leased for `lease`; nullopt when none.
  std::optional<LeasedTask> NextOwned(const std::string& worker, absl::Duration lease);
  // Else a ready task of an unowned span, which `worker` then owns, when it owns fewer spans
  // of the step than the quota (never with the worker tree). Spans of owners no longer live
  // are freed first.
  std::optional<LeasedTask> Claim(const std::string& worker, const Live& live,
                                  int64_t live_count, absl::Duration lease);

  // The tensors FetchInputs streams for task `id` (engine/span_tensors.h), the parameters
  // apart (TaskServiceImpl's one snapshot of them per step).
  TensorMap Inputs(int64_t id, bool include_span) const;

  // Checks a result before it is applied: OK, or INVALID_ARGUMENT for a malformed one (with
  // the worker tree, also one whose partials are all finite: they belong in the tree).
  // *nonfinite names a NaN or infinity among its values ("" when none).
  absl::Status CheckResult(int64_t id, TensorMap& tensors, Result& out,
                           std::string* nonfinite) const;

  // The worker tree (proto/adjsh.proto WorkerTree) sums the partials: results carry none, and
  // each group's root comes through SetReduced. Call before any result.
  void ReduceAmongWorkers();
  bool among_workers() const { return groups_ != nullptr; }
  // A group's root from the tree: INVALID_ARGUMENT for a malformed one, FAILED_PRECONDITION
  // for a group reduced already.
  absl::Status SetReduced(int32_t group, TensorMap& tensors);
  uint64_t GroupBytes(int32_t group) const;
  // Every task done and, with the worker tree, every group's root in.
  bool Done() const;
  void Apply(int64_t id, Result&& result, const std::string& worker,
             uint64_t bytes_in, uint64_t bytes_out, absl::Time leased);

  // Limits for receiving a result of task `id`: twice its largest size, at least 64 KiB.
  uint64_t MaxResultBytes(int64_t id) const;

  TaskQueue& queue() { return *queue_; }
  int64_t n_targets() const {
    return std::visit([](const auto& s) { return s.ledger->n_targets(); }, model_);
  }
  const SpanPlan& plan() const { return *plan_; }
  const SpanTask& task(int64_t id) const { return plan_->task(id); }
  // After every task: the result, its profile filled (wire bytes given by the caller), for the
  // model type the scheduler was made for (ModelParams or Mamba2Params).
  template <template <typename> class P>
  GradResult<float, P> Finish(uint64_t wire_bytes);
  const std::vector<TaskRecord>& records() const { return records_; }

 private:
  SpanScheduler() = default;
  // The plan and task queue of a sequence of `config`'s model.
  template <typename C>
  static absl::StatusOr<std::unique_ptr<SpanScheduler>> MakeFor(const C& config,
                                                                std::span<const uint32_t> tokens,
                                                                const GradOptions& options);
  // f(ledger, config) with the sequence's ledger and its model's config, of either type.
  template <typename F>
  decltype(auto) WithLedger(F&& f) const;
  std::span<const uint32_t> tokens_;
  GradOptions options_;
  std::unique_ptr<SpanPlan> plan_;
  EachFamily<SequenceModel> model_;
  // With the worker tree (ReduceAmongWorkers): the wire form of the step's groups.
  std::unique_ptr<const GroupLayout> groups_;
  std::unique_ptr<TaskQueue> queue_;
  SpanOwners* owners_ = nullptr;
  int64_t span_base_ = 0;
  std::vector<TaskRecord> records_;
  absl::Time start_;
};

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_SPAN_SCHEDULER_H_
