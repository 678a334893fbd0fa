#include "engine/capabilities.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/mamba2_chunk_ops.h"
#include "kernels/backend.h"

namespace adjsh {
namespace {

// The options that are not built everywhere. An option that every model type and runner
// takes (chunk, spans, threads, bf16 storage, a loss mask, a spill directory) has no row.
enum class Option { kF64, kWindow, kTopOfStack, kWavefront, kTwoPass, kDocStarts, kForwardOnly };

struct OptionRow {
  Option option;
  const char* flag;   // as the command line names it
  const char* field;  // as a job spec (proto/adjsh.proto JobSpec) or the trainer names it
  // built[model][runner]: ModelType {kMamba, kMamba2} x Runner {kInProcess, kWorkers}.
  bool built[2][2];
  const char* why_not_on_workers;  // where built in-process only
  const char* why_not_for_mamba2;  // where not built for Mamba-2 at all
};

constexpr OptionRow kOptionTable[] = {
    {Option::kF64, "--dtype f64", "dtype f64", {{true, false}, {true, false}},
     "workers compute the exact f32 gradient by the span schedule", nullptr},
    {Option::kWindow, "--window", "window", {{true, false}, {false, false}},
     "a truncated window's chunks read rows of later spans", "it is built for Mamba-1 only"},
    {Option::kTopOfStack, "--cotangent top-of-stack", "cotangent top-of-stack",
     {{true, false}, {false, false}},
     "its layers run one after another in this process", "it is built for Mamba-1 only"},
    {Option::kWavefront, "--schedule wavefront", "schedule wavefront",
     {{true, false}, {false, false}},
     "workers run the span schedule", "a Mamba-2 model's gradient is the span schedule's"},
    {Option::kTwoPass, "--schedule two-pass", "schedule two-pass", {{true, false}, {false, false}},
     "workers run the span schedule", "a Mamba-2 model's gradient is the span schedule's"},
    {Option::kDocStarts, "--doc-starts", "doc_starts", {{true, false}, {false, false}},
     "a sequence cut at its documents runs as its pieces in this process",
     "it is built for Mamba-1 only"},
    // Forward-only span steps: evaluation through workers (Trainer::set_evaluation_source); a
    // Mamba-2 run in-process evaluates by streaming instead (engine/evaluate.h).
    {Option::kForwardOnly, "forward-only span steps", "forward_only",
     {{true, true}, {false, true}}, nullptr, "in-process it evaluates by streaming"},
};

bool Uses(Option option, const RunRequest& r) {
  const GradOptions& o = r.options;
  switch (option) {
    case Option::kF64: return r.f64;
    case Option::kWindow: return o.window != 0;
    case Option::kTopOfStack: return o.cotangent == Cotangent::kTopOfStack;
    case Option::kWavefront: return o.schedule == Schedule::kWavefront;
    case Option::kTwoPass: return o.schedule == Schedule::kTwoPass;
    case Option::kDocStarts: return r.doc_starts;
    case Option::kForwardOnly: return o.forward_only;
  }
  return false;
}

}  // namespace

absl::Status Supports(const RunRequest& r, Naming naming) {
  const bool flags = naming == Naming::kFlag;
  const bool mamba2 = r.model == ModelType::kMamba2;
  const bool workers = r.runner == Runner::kWorkers;
  for (const OptionRow& row : kOptionTable) {
    if (!Uses(row.option, r) || row.built[mamba2][workers]) continue;
    const char* name = flags ? row.flag : row.field;
    if (mamba2 && !row.built[1][0] && !row.built[1][1]) {
      return absl::UnimplementedError(absl::StrCat(
          name, " is not available for Mamba-2 models (model_type mamba2): ",
          row.why_not_for_mamba2));
    }
    if (workers) {
      return absl::UnimplementedError(absl::StrCat(
          name, flags ? " runs in-process only (no --workers): " : " runs in-process only, not "
                                                                   "on workers: ",
          row.why_not_on_workers));
    }
    return absl::UnimplementedError(absl::StrCat(name, " is not built in-process for this model: ",
                                                 row.why_not_for_mamba2));
  }
  // Rules that tie two options together.
  const GradOptions& o = r.options;
  if (workers && !o.device.is_cpu()) {
    return absl::InvalidArgumentError(
        flags ? "with --workers the coordinator computes nothing: give the device to the "
                "workers with --worker-device"
              : "the coordinator computes nothing itself: give the device to the workers (adjsh "
                "worker --device)");
  }
  if (r.training && o.schedule == Schedule::kTwoPass) {
    return absl::UnimplementedError(
        "--schedule two-pass is adjsh grad's only: training takes spans or wavefront");
  }
  if (r.trace && o.schedule != Schedule::kSpans) {
    return absl::InvalidArgumentError("--trace records the span schedule only");
  }
  if (r.trace && r.doc_starts) {
    return absl::InvalidArgumentError("--doc-starts runs in-process (no --workers or --trace)");
  }
  if (o.forward_only &&
      (o.schedule != Schedule::kSpans || o.window != 0 || o.cotangent != Cotangent::kExact)) {
    return absl::InvalidArgumentError(
        "forward_only (the loss alone) runs the span schedule of the exact gradient only");
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CheckDevice(const MambaConfig& config, const GradOptions& options) {
  if (options.device.is_cpu() && !options.device.bf16_storage) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend =
      MakeBackendFor<T>(options.device, config, {});  // the ops below, each named if lacking
  if (!backend.ok()) return backend.status();
  std::vector<Op> ops = {Op::kHead};
  // (push_back, not insert of a list: GCC 12 misreads the latter as an overflow.)
  const auto add = [&ops](std::initializer_list<Op> more) {
    for (Op op : more) ops.push_back(op);
  };
  if (!options.loss_mask.empty()) ops.push_back(Op::kHeadAccuracy);
  const bool spans = options.schedule == Schedule::kSpans && options.window == 0 &&
                     options.cotangent == Cotangent::kExact;
  if (options.window > 0) {
    add({Op::kForward, Op::kBackwardTruncated});
  } else if (spans) {
    add({Op::kForward, Op::kBackwardExact});
    if (options.spans != 1) add({Op::kLocalSummary, Op::kAdjointSummary});
  } else if (options.schedule != Schedule::kWavefront) {
    add({Op::kLocalSummary, Op::kForward, Op::kAdjointSummary, Op::kBackwardExact});
  } else {
    add({Op::kForward, Op::kBackwardExact});
  }
  for (Op op : ops) {
    if (absl::Status s = (*backend)->Require(op); !s.ok()) {
      if (spans && (op == Op::kLocalSummary || op == Op::kAdjointSummary)) {
        return absl::UnimplementedError(absl::StrCat(
            s.message(), ": more than one span needs it (--spans 1 runs the step as one span)"));
      }
      return s;
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CheckDevice(const Mamba2Config&, const GradOptions& options) {
  if (options.device.is_cpu() && !options.device.bf16_storage) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend = MakeBackend<T>(options.device);
  if (!backend.ok()) return backend.status();
  return CheckMamba2Backend(**backend, !options.loss_mask.empty());
}

template absl::Status CheckDevice<float>(const MambaConfig&, const GradOptions&);
template absl::Status CheckDevice<double>(const MambaConfig&, const GradOptions&);
template absl::Status CheckDevice<float>(const Mamba2Config&, const GradOptions&);
template absl::Status CheckDevice<double>(const Mamba2Config&, const GradOptions&);

}  // namespace adjsh
