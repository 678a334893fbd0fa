// What adjsh grad writes, for either model type: the gradient's tensors (HF names and shapes)
// with the scalar 'loss' in one safetensors file, and the summary line on stderr.
#ifndef ADJSH_CLI_GRAD_OUTPUT_H_
#define ADJSH_CLI_GRAD_OUTPUT_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/safetensors.h"

namespace adjsh::cli {

// tensors plus "loss" (a scalar of `dtype`) to path, atomically.
absl::Status WriteGradOutput(const std::string& path, TensorMap tensors, double loss,
                             DType dtype);

// "loss L  tokens N  S s  R tokens/s  peak RSS M MiB (B B/token)  -> PATH[ NOTE]".
void PrintGradSummary(double loss, size_t tokens, double seconds, const std::string& path,
                      std::string_view note = "");

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_GRAD_OUTPUT_H_
