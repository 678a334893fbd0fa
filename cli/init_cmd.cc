// adjsh init: a new model directory with Mamba's published initialisation.
#include <cstdio>

#include "absl/strings/numbers.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/model.h"

namespace adjsh::cli {
namespace {

absl::StatusOr<MambaConfig> ConfigFromFlags(const ArgParser& a) {
  MambaConfig c;
  struct IntFlag {
    const char* name;
    int64_t* field;
  };
  for (const IntFlag& f : {IntFlag{"hidden-size", &c.hidden_size},
                           IntFlag{"layers", &c.num_hidden_layers},
                           IntFlag{"state-size", &c.state_size},
                           IntFlag{"conv-kernel", &c.conv_kernel}, IntFlag{"expand", &c.expand},
                           IntFlag{"vocab-size", &c.vocab_size}}) {
    absl::StatusOr<int64_t> v = a.GetInt(f.name, 1, int64_t{1} << 31);
    if (!v.ok()) return v.status();
    *f.field = *v;
  }
  const std::string rank = a.Get("dt-rank");
  if (rank == "auto") {
    c.time_step_rank = (c.hidden_size + 15) / 16;
  } else {
    absl::StatusOr<int64_t> v = a.GetInt("dt-rank", 1, int64_t{1} << 31);
    if (!v.ok()) return v.status();
    c.time_step_rank = *v;
  }
  absl::StatusOr<double> eps = a.GetDouble("layer-norm-epsilon");
  if (!eps.ok()) return eps.status();
  c.layer_norm_epsilon = *eps;
  if (absl::Status s = ValidateConfig(c); !s.ok()) return s;
  return c;
}

}  // namespace

int InitCommand(const std::vector<std::string>& args) {
  ArgParser a("init",
              "Writes a new model directory (HF MambaForCausalLM config.json and\n"
              "model.safetensors) with Mamba's initialisation, deterministic for a seed.");
  a.Add("out", "DIR", "directory to create or overwrite", "", true);
  a.Add("hidden-size", "D", "model width", "", true);
  a.Add("layers", "K", "number of Mamba layers", "", true);
  a.Add("vocab-size", "V", "vocabulary size", "", true);
  a.Add("state-size", "N", "SSM state size", "16");
  a.Add("conv-kernel", "W", "causal conv width", "4");
  a.Add("expand", "E", "inner width factor (Di = E*D)", "2");
  a.Add("dt-rank", "R", "dt projection rank, or auto = ceil(D/16)", "auto");
  a.Add("layer-norm-epsilon", "EPS", "RMSNorm epsilon", "1e-5");
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
  const absl::Status status =
      dtype == "f64"
          ? SaveModelDir(a.Get("out"), InitParams<double>(*config, *seed), DType::kF64)
          : SaveModelDir(a.Get("out"), InitParams<float>(*config, *seed),
                         dtype == "f32" ? DType::kF32 : DType::kBF16);
  return status.ok() ? 0 : Fail("init", status);
}

}  // namespace adjsh::cli
