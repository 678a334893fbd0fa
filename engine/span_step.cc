#include "engine/span_step.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "common/thread_pool.h"
#include "engine/device_sums.h"
#include "engine/span_ledger.h"
#include "engine/span_plan.h"
#include "engine/span_work.h"
#include "kernels/backend.h"
#include "kernels/mamba2_chunk_ops.h"
#include "kernels/mamba_chunk_ops.h"

namespace adjsh {

namespace {

// What the runner takes of either model type's options.
struct SpanRun {
  int threads = 0;
  std::span<const uint8_t> loss_mask;
  Storage storage = Storage::kCompute;
  std::string spill_dir;
  std::function<void(std::string_view, int64_t, int64_t)> progress;
};

// The plan's tasks on the step's threads, each span's on its own Work (SpanWork,
// Mamba2SpanWork, built from model), their results applied to one ledger.
template <typename T, template <typename> class P, typename Work, typename Model>
GradResult<T, P> RunSpans(const P<T>& params, const Model& model, const SpanPlan& plan,
                          std::span<const uint32_t> tokens, const SpanRun& opt) {
  const int64_t K = plan.layers();
  SpanLedger<T, P> ledger(params, plan, tokens, opt.loss_mask);
  const int64_t S = plan.spans();
  std::vector<std::unique_ptr<Work>> work(S);
  std::mutex mu;  // the ledger, the progress counts and peak_bytes
  int64_t done_fwd = 0, done_bwd = 0, kept = 0, peak = 0;
  std::vector<int64_t> span_bytes(S, 0);
  ThreadPool pool(opt.threads);
  std::vector<TaskRecord> records(plan.num_tasks());
  // The model's backend (either model type has one) says when its kept budget refuses a set.
  const Backend<T>& backend = *model.backend;
  const int64_t refused_before = backend.KeptRefusals();
  // A resident model's partials are summed on its device (engine/device_sums.h).
  std::unique_ptr<DeviceSums<T, P, Model>> device_sums;
  if (!model.rows->host())
    device_sums = std::make_unique<DeviceSums<T, P, Model>>(model, plan, ledger);
  const auto start = std::chrono::steady_clock::now();
  RunDag(
      pool, plan.num_tasks(), [&](int64_t id) { return plan.Successors(id); },
      [&](int64_t id) {
        const SpanTask& task = plan.task(id);
        SpanInputs<T> in;
        {
          std::lock_guard<std::mutex> lock(mu);
          in = ledger.Inputs(id);
        }
        // A span's tasks form a chain (span_plan.h), so only this thread touches work[s] now.
        std::unique_ptr<Work>& w = work[task.span];
        const DeviceTraffic traffic_before = backend.ThreadTraffic();  // this thread's
        if (!w) {
          std::vector<uint32_t> toks;
          std::vector<uint8_t> mask;
          {
            std::lock_guard<std::mutex> lock(mu);
            toks = ledger.SpanTokens(task.span), mask = ledger.SpanMask(task.span);
          }
          w = std::make_unique<Work>(model, plan, task.span, std::move(toks),
                                            std::move(mask), ledger.n_targets(), opt.storage,
                                            opt.spill_dir);
        }
        typename SpanLedger<T, P>::Outputs out;
        const auto t0 = std::chrono::steady_clock::now();
        const absl::Status s =
            w->Run(task, in, out, device_sums ? Partials::kDevice : Partials::kHost);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ADJSH_CHECK(s.ok(), std::string(s.message()).c_str());
        const DeviceTraffic traffic = backend.ThreadTraffic() - traffic_before;
        const int64_t bytes = w->kept_bytes();
        // The span's last task: its rows go.
        if ((task.phase == SpanPhase::kBackward && task.layer == 0) ||
            (plan.forward_only() && task.phase == SpanPhase::kForward && task.layer == K - 1))
          w.reset();
        std::lock_guard<std::mutex> lock(mu);
        TaskRecord& rec = records[id];
        rec.compute_s = seconds;
        rec.end_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        rec.start_s = rec.end_s - seconds;
        rec.worker = "in-process";
        rec.device = traffic;
        if (device_sums) device_sums->Take(task, out);
        ledger.Apply(id, std::move(out));
        kept += bytes - span_bytes[task.span];
        span_bytes[task.span] = bytes;
        peak = std::max(peak, kept + ledger.held_bytes());
        if (task.phase == SpanPhase::kForward && ++done_fwd % S == 0) {
          if (opt.progress) opt.progress("forward", done_fwd / S, K);
          if (done_fwd == K * S && opt.progress) opt.progress("head", 1, 1);
        }
        if (task.phase == SpanPhase::kBackward && ++done_bwd % S == 0 && opt.progress)
          opt.progress("backward", done_bwd / S, K);
      },
      // Once the kept budget has refused a summary a set (Backend::KeptRefusals), a ready
      // forward or VJP task goes before a ready summary: each takes the sets its span's summary
      // kept, so they go back to the budget before more summaries ask for it. Taken in the
      // order they became ready, a layer's summaries ran for every span first and long sequences
      // kept sets for far fewer chunks (docs/BENCHMARKS.md, "What was tried"). While none is
      // refused that order stays: it keeps the threads busier.
      [&](int64_t id) {
        const SpanPhase p = plan.task(id).phase;
        const bool summary = p == SpanPhase::kForwardSummary || p == SpanPhase::kBackwardSummary;
        return summary && backend.KeptRefusals() > refused_before ? 1 : 0;
      });
  GradResult<T, P> result = ledger.Finish();
  result.stored_bytes = peak;
  result.profile = ProfileStep(
      plan, records, 0,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  result.records = std::move(records);
  return result;
}

// Resident on a GPU (kernels/row_space.h) unless the rows are rounded to bf16 or spilled: a
// device keeps its rows in the compute type, in its own memory.
template <typename O>
RowPlace RowsFor(const O& opt) {
  return opt.storage == Storage::kCompute && opt.spill_dir.empty() ? RowPlace::kResident
                                                                   : RowPlace::kHost;
}

}  // namespace

template <typename T>
absl::StatusOr<GradResult<T>> RunSpanStep(const ModelParams<T>& params,
                                          std::span<const uint32_t> tokens,
                                          const GradOptions& opt) {
  const MambaConfig& c = params.config;
  absl::StatusOr<SpanPlan> plan =
      SpanPlan::Make(static_cast<int64_t>(tokens.size()), opt.chunk, opt.spans,
                     c.num_hidden_layers, c.conv_kernel, opt.forward_only);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend = MakeBackend<T>(opt.device);
  if (!backend.ok()) return backend.status();
  const LayerModel<ModelParams<T>> model = MakeLayerModel(params, **backend, RowsFor(opt));
  return RunSpans<T, ModelParams, SpanWork<T>>(
      params, model, *plan, tokens,
      {opt.threads, opt.loss_mask, opt.storage, opt.spill_dir, opt.progress});
}

template <typename T>
absl::StatusOr<Mamba2GradResult<T>> RunMamba2SpanStep(const Mamba2Params<T>& params,
                                                      std::span<const uint32_t> tokens,
                                                      const Mamba2GradOptions& opt) {
  const Mamba2Config& c = params.config;
  absl::StatusOr<SpanPlan> plan =
      SpanPlan::Make(static_cast<int64_t>(tokens.size()), opt.chunk, opt.spans,
                     c.num_hidden_layers, c.conv_kernel);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<DeviceModel<Mamba2Params<T>>> model =
      MakeDeviceModel(params, opt.device, !opt.loss_mask.empty(), RowsFor(opt));
  if (!model.ok()) return model.status();
  return RunSpans<T, Mamba2Params, Mamba2SpanWork<T>>(
      params, model->model, *plan, tokens,
      {opt.threads, opt.loss_mask, opt.storage, opt.spill_dir, opt.progress});
}

template absl::StatusOr<GradResult<float>> RunSpanStep<float>(const ModelParams<float>&,
                                                              std::span<const uint32_t>,
                                                              const GradOptions&);
template absl::StatusOr<GradResult<double>> RunSpanStep<double>(const ModelParams<double>&,
                                                                std::span<const uint32_t>,
                                                                const GradOptions&);
template absl::StatusOr<Mamba2GradResult<float>> RunMamba2SpanStep<float>(
    const Mamba2Params<float>&, std::span<const uint32_t>, const Mamba2GradOptions&);
template absl::StatusOr<Mamba2GradResult<double>> RunMamba2SpanStep<double>(
    const Mamba2Params<double>&, std::span<const uint32_t>, const Mamba2GradOptions&);

}  // namespace adjsh
