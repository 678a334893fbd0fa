#include "cli/grad_output.h"

#include <cstdio>
#include <span>

#include "common/proc_stats.h"

namespace adjsh::cli {

absl::Status WriteGradOutput(const std::string& path, TensorMap tensors, double loss,
                             DType dtype) {
  tensors["loss"] = HostTensor::From<double>(std::span<const double>(&loss, 1), {}, dtype);
  return WriteSafetensors(path, tensors);
}

void PrintGradSummary(double loss, size_t tokens, double seconds, const std::string& path,
                      std::string_view note) {
  const double n = static_cast<double>(tokens);
  std::fprintf(stderr,
               "loss %.6f  tokens %zu  %.2f s  %.0f tokens/s  peak RSS %.1f MiB (%.0f B/token)"
               "  -> %s%s%.*s\n",
               loss, tokens, seconds, n / seconds, PeakResidentBytes() / 1048576.0,
               PeakResidentBytes() / n, path.c_str(), note.empty() ? "" : " ",
               static_cast<int>(note.size()), note.data());
}

}  // namespace adjsh::cli
