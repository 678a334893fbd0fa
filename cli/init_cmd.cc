// adjsh init: a new model directory with Mamba's published initialisation.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "common/model.h"

namespace adjsh::cli {

int InitCommand(const std::vector<std::string>& args) {
  ArgParser a("init",
              "Writes a new model directory (HF MambaForCausalLM config.json and\n"
              "model.safetensors) with Mamba's initialisation, deterministic for a seed.");
  a.Add("out", "DIR", "directory to create or overwrite", "", true);
  AddModelFlags(a, {});
  a.Add("seed", "S", "random seed", "0");
  a.Add("dtype", "f32|f64|bf16", "storage dtype of model.safetensors", "f32");
  if (auto code = ParseOrExit(a, args)) return *code;

  absl::StatusOr<MambaConfig> config = ConfigFromFlags(a);
  if (!config.ok()) return BadUsage("init", config.status());
  absl::StatusOr<int64_t> seed = a.GetInt("seed", 0, INT64_MAX);
  if (!seed.ok()) return BadUsage("init", seed.status());
  const std::string dtype = a.Get("dtype");
  if (dtype != "f32" && dtype != "f64" && dtype != "bf16") {
    return BadUsage("init", absl::InvalidArgumentError("--dtype must be f32, f64 or bf16, got '" +
                                                       dtype + "'"));
  }
  // The parameters, and the file's bytes while they are written.
  if (absl::Status s = CheckModelFitsInMemory(*config, dtype == "f64" ? 4 : 2); !s.ok())
    return Fail("init", s);
  const absl::Status status =
      dtype == "f64"
          ? SaveModelDir(a.Get("out"), InitParams<double>(*config, *seed), DType::kF64)
          : SaveModelDir(a.Get("out"), InitParams<float>(*config, *seed),
                         dtype == "f32" ? DType::kF32 : DType::kBF16);
  return status.ok() ? 0 : Fail("init", status);
}

}  // namespace adjsh::cli
