// adjsh init: a new model directory with Mamba's published initialisation.
#include <cstdio>

#include "absl/strings/str_format.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "common/model.h"
#include "common/mamba2_init.h"
#include "common/mamba2_model.h"

namespace adjsh::cli {
namespace {

int InitMamba2(const ArgParser& a, uint64_t seed, const std::string& dtype) {
  absl::StatusOr<Mamba2Config> config = Mamba2ConfigFromFlags(a);
  if (!config.ok()) return BadUsage("init", config.status());
  // The parameters, and the file's bytes while they are written (as Mamba-1's, below).
  if (absl::Status s = CheckParamsFitInMemory(
          Mamba2ParamBytesF32(*config), dtype == "f64" ? 4 : 2,
          absl::StrFormat("Mamba-2 D=%d, K=%d, V=%d", config->hidden_size,
                          config->num_hidden_layers, config->vocab_size));
      !s.ok())
    return Fail("init", s);
  const DType out = dtype == "f64" ? DType::kF64 : dtype == "f32" ? DType::kF32 : DType::kBF16;
  // Initialised in f64 for an f64 file, so that it holds no f32 rounding.
  absl::Status status;
  if (out == DType::kF64) {
    absl::StatusOr<Mamba2Params<double>> p = InitMamba2Params<double>(*config, seed);
    status = p.ok() ? SaveMamba2ModelDir(a.Get("out"), *p, out) : p.status();
  } else {
    absl::StatusOr<Mamba2Params<float>> p = InitMamba2Params<float>(*config, seed);
    status = p.ok() ? SaveMamba2ModelDir(a.Get("out"), *p, out) : p.status();
  }
  return status.ok() ? 0 : Fail("init", status);
}

}  // namespace

int InitCommand(const std::vector<std::string>& args) {
  ArgParser a("init",
              "Writes a new model directory (HF MambaForCausalLM config.json and\n"
              "model.safetensors, or Mamba2ForCausalLM's with --model-type mamba2) with the\n"
              "published initialisation, deterministic for a seed.");
  a.Add("out", "DIR", "directory to create or overwrite", "", true);
  a.Add("model-type", "mamba|mamba2", "the layer type", "mamba");
  AddModelFlags(a, {});
  AddMamba2Flags(a);
  a.Add("seed", "S", "random seed", "0");
  a.Add("dtype", "f32|f64|bf16", "storage dtype of model.safetensors", "f32");
  if (auto code = ParseOrExit(a, args)) return *code;

  absl::StatusOr<int64_t> seed = a.GetInt("seed", 0, INT64_MAX);
  if (!seed.ok()) return BadUsage("init", seed.status());
  const std::string dtype = a.Get("dtype");
  if (dtype != "f32" && dtype != "f64" && dtype != "bf16") {
    return BadUsage("init", absl::InvalidArgumentError("--dtype must be f32, f64 or bf16, got '" +
                                                       dtype + "'"));
  }
  const std::string type = a.Get("model-type");
  if (type != "mamba" && type != "mamba2") {
    return BadUsage("init", absl::InvalidArgumentError(
                                "--model-type must be mamba or mamba2, got '" + type + "'"));
  }
  if (type == "mamba2") return InitMamba2(a, *seed, dtype);
  if (a.Get("head-dim") != "64" || a.Get("groups") != "1") {
    return BadUsage("init", absl::InvalidArgumentError(
                                "--head-dim and --groups are Mamba-2's (--model-type mamba2)"));
  }
  absl::StatusOr<MambaConfig> config = ConfigFromFlags(a);
  if (!config.ok()) return BadUsage("init", config.status());
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
