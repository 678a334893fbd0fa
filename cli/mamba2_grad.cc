#include "cli/mamba2_grad.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "cli/grad_output.h"
#include "coordinator/local_cluster.h"
#include "common/file_io.h"
#include "common/mamba2_config.h"
#include "common/tokens.h"
#include "engine/mamba2_grad.h"
#include "engine/step_profile.h"

namespace adjsh::cli {
namespace {

template <typename T>
absl::Status Run(const std::string& model_dir, const std::string& tokens_path,
                 const std::string& out_path, const GradOptions& options, int workers,
                 bool worker_tree, std::vector<std::string> worker_devices, bool quiet) {
  absl::StatusOr<Mamba2Params<T>> params = LoadMamba2ModelDir<T>(model_dir);
  if (!params.ok()) return params.status();
  absl::StatusOr<std::vector<uint32_t>> tokens = ReadTokenFile(tokens_path);  // ids checked
  if (!tokens.ok()) return tokens.status();                                   // by the gradient
  auto start = std::chrono::steady_clock::now();
  double seconds = -1;  // with workers: until the result is in, not the cluster's stop
  absl::StatusOr<Mamba2GradResult<T>> g;
  if constexpr (std::is_same_v<T, float>) {
    if (workers > 0) {
      if (absl::Status s = CheckTokensInVocab(*tokens, params->config.vocab_size); !s.ok())
        return s;
      coordinator::LocalClusterOptions cluster_options;
      cluster_options.service.worker_tree = worker_tree;
      cluster_options.worker_devices = std::move(worker_devices);
      cluster_options.kept_budget = options.device.kept_budget;
      absl::StatusOr<std::unique_ptr<coordinator::LocalCluster>> cluster =
          coordinator::LocalCluster::Start(workers, SelfExe(), std::move(cluster_options));
      if (!cluster.ok()) return cluster.status();
      start = std::chrono::steady_clock::now();  // the gradient's time, not the workers' start
      g = (*cluster)->service().ComputeGradient(*params, *tokens, options, "grad", 0);
      seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  if (workers == 0) g = Mamba2Gradient<T>(*params, *tokens, Mamba2GradOptionsFrom(options));
  if (!g.ok()) return g.status();
  if (seconds < 0)
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const DType dtype = std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
  if (absl::Status s =
          WriteGradOutput(out_path, Mamba2ParamsToTensors(g->grad, dtype), g->loss, dtype);
      !s.ok())
    return s;
  if (!quiet) {
    const std::string where =
        workers == 0 ? "in-process" : absl::StrCat(workers, workers == 1 ? " worker" : " workers");
    PrintGradSummary(g->loss, tokens->size(), seconds, out_path,
                     absl::StrCat("(Mamba-2, ", where, ")"));
    if (workers > 0) std::fprintf(stderr, "%s\n", ProfileSummary(g->profile).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunMamba2Grad(const std::string& model_dir, const std::string& tokens_path,
                           const std::string& out_path, bool f64, const GradOptions& options,
                           int workers, bool worker_tree, std::vector<std::string> worker_devices,
                           bool quiet) {
  return f64 ? Run<double>(model_dir, tokens_path, out_path, options, workers, worker_tree,
                           std::move(worker_devices), quiet)
             : Run<float>(model_dir, tokens_path, out_path, options, workers, worker_tree,
                          std::move(worker_devices), quiet);
}

}  // namespace adjsh::cli
