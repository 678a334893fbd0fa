// adjsh grad for Mamba-2 models (model_type "mamba2"): the exact gradient on the CPU, in-process
// (engine/mamba2_grad.h) or on local workers, written as adjsh grad writes a Mamba-1 model's
// (HF names, 'loss').
#ifndef ADJSH_CLI_MAMBA2_GRAD_H_
#define ADJSH_CLI_MAMBA2_GRAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/mamba2_grad.h"

namespace adjsh::cli {

// f64 when f64, else f32. In-process on options.device (workers 0), or with workers > 0 (f32
// only) on a local cluster of that many worker processes (coordinator/local_cluster.h) on
// worker_devices (empty: the CPU; as `--worker-device`), reducing among them when worker_tree
// (--reduce tree) else through the coordinator; the same bits for any number and either
// reduction on one kind of device. Prints the summary line (and the step's profile with
// workers) unless quiet.
absl::Status RunMamba2Grad(const std::string& model_dir, const std::string& tokens_path,
                           const std::string& out_path, bool f64, const GradOptions& options,
                           int workers, bool worker_tree, std::vector<std::string> worker_devices,
                           bool quiet);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_MAMBA2_GRAD_H_
