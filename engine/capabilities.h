// What can run where, answered in one place: for a model type, where a step's tasks run (in
// this process, or on workers) and the options of one gradient, whether the combination is
// built, and if not which option and why. Every command (cli/grad_cmd.cc, cli/train_cmd.cc),
// the job checks (coordinator/job_spec.cc), the coordinator's step (coordinator/
// task_service_step.cc), the model families (engine/families/) and the engine's
// own entry points (engine/adjoint_engine.cc) ask it, so a refusal reads the same everywhere.
//
// Two levels, in the spirit of a backend's supports_op:
//   Supports         the option table below: (model type, runner, option) -> built or not, with
//                    the reason, plus the few rules that tie two options together;
//   CheckDevice      the kernels: the ops (kernels/backend.h Op) the options' schedule calls,
//                    each required of the device's backend (OK on the CPU, which has them all).
// Adding a model type: one more column in kOptionTable (engine/capabilities.cc) and its device
// check.
#ifndef ADJSH_ENGINE_CAPABILITIES_H_
#define ADJSH_ENGINE_CAPABILITIES_H_

#include <string_view>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/mamba2_config.h"
#include "engine/grad_options.h"

namespace adjsh {

enum class ModelType { kMamba, kMamba2 };

// Where a step's (layer, span) tasks run: threads of this process, or worker processes (local
// or remote) that the coordinator hands them to.
enum class Runner { kInProcess, kWorkers };

// How a refusal names an option: as the command line's flag (--window) or as the job spec's
// field (window).
enum class Naming { kFlag, kSpecField };

// One computation, as a command or a job asks for it, before anything runs.
struct RunRequest {
  ModelType model = ModelType::kMamba;
  Runner runner = Runner::kInProcess;
  bool f64 = false;            // the compute type; workers and devices compute f32
  GradOptions options;         // window, cotangent, schedule, device, forward_only, ...
  bool training = false;       // a training run (adjsh train, a job) rather than adjsh grad
  bool doc_starts = false;     // adjsh grad --doc-starts (a sequence cut at document starts)
  bool trace = false;          // a task trace (--trace) is recorded
};

// OK, or the first option of the request that is not built for its model type and runner:
// UNIMPLEMENTED naming the option and the reason; INVALID_ARGUMENT for a combination that
// means nothing (a device for a coordinator, which computes nothing; a trace of a schedule
// that has no span tasks).
absl::Status Supports(const RunRequest& request, Naming naming = Naming::kFlag);

// OK on the CPU; else the device's backend must exist for T, take the config and support every
// op the options' schedule uses (UNIMPLEMENTED or FAILED_PRECONDITION naming what is missing).
// A Mamba-2 model needs its layer op, the head (and its greedy count with a loss mask), and f32
// storage on a GPU (kernels/mamba2_chunk_ops.h CheckMamba2Backend).
template <typename T>
absl::Status CheckDevice(const MambaConfig& config, const GradOptions& options);
template <typename T>
absl::Status CheckDevice(const Mamba2Config& config, const GradOptions& options);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_CAPABILITIES_H_
