#include "cli/mamba2_grad.h"

#include <chrono>

#include "cli/grad_output.h"
#include "common/file_io.h"
#include "common/mamba2_config.h"
#include "common/tokens.h"
#include "engine/mamba2_grad.h"

namespace adjsh::cli {
namespace {

template <typename T>
absl::Status Run(const std::string& model_dir, const std::string& tokens_path,
                 const std::string& out_path, const Mamba2GradOptions& options, bool quiet) {
  absl::StatusOr<Mamba2Params<T>> params = LoadMamba2ModelDir<T>(model_dir);
  if (!params.ok()) return params.status();
  absl::StatusOr<std::vector<uint32_t>> tokens = ReadTokenFile(tokens_path);  // ids checked
  if (!tokens.ok()) return tokens.status();                                   // by the gradient
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Mamba2GradResult<T>> g = Mamba2Gradient<T>(*params, *tokens, options);
  if (!g.ok()) return g.status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const DType dtype = std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
  if (absl::Status s =
          WriteGradOutput(out_path, Mamba2ParamsToTensors(g->grad, dtype), g->loss, dtype);
      !s.ok())
    return s;
  if (!quiet) {
    PrintGradSummary(g->loss, tokens->size(), seconds, out_path, "(Mamba-2, in-process)");
  }
  return absl::OkStatus();
}

}  // namespace

std::string ModelTypeOfDir(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFileToString(dir + "/config.json");
  if (!text.ok()) return "";
  absl::StatusOr<std::string> type = ModelTypeOf(*text);
  return type.ok() ? *type : "";
}

absl::Status RunMamba2Grad(const std::string& model_dir, const std::string& tokens_path,
                           const std::string& out_path, bool f64,
                           const Mamba2GradOptions& options, bool quiet) {
  return f64 ? Run<double>(model_dir, tokens_path, out_path, options, quiet)
             : Run<float>(model_dir, tokens_path, out_path, options, quiet);
}

}  // namespace adjsh::cli
