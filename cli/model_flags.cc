#include "cli/model_flags.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"

namespace adjsh::cli {

void AddModelFlags(ArgParser& a, const ModelFlagDefaults& d) {
  a.Add("hidden-size", "D", "model width", d.hidden_size, d.hidden_size.empty());
  a.Add("layers", "K", "number of Mamba layers", d.layers, d.layers.empty());
  a.Add("vocab-size", "V", "vocabulary size", d.vocab_size, d.vocab_size.empty());
  a.Add("state-size", "N", "SSM state size", "16");
  a.Add("conv-kernel", "W", "causal conv width", "4");
  a.Add("expand", "E", "inner width factor (Di = E*D)", "2");
  a.Add("dt-rank", "R", "dt projection rank, or auto = ceil(D/16)", "auto");
  a.Add("layer-norm-epsilon", "EPS", "RMSNorm epsilon", "1e-5");
  a.AddBool("untied-head", "an LM head of its own (lm_head.weight) instead of the embedding");
}

namespace {

struct IntFlag {
  const char* name;
  int64_t* field;
};

// Each flag's value (1 .. 2^31) into its field; the first bad one's error.
absl::Status ReadIntFlags(const ArgParser& a, std::initializer_list<IntFlag> flags) {
  for (const IntFlag& f : flags) {
    absl::StatusOr<int64_t> v = a.GetInt(f.name, 1, int64_t{1} << 31);
    if (!v.ok()) return v.status();
    *f.field = *v;
  }
  return absl::OkStatus();
}

// The shape flags both model types share, into a config of either.
template <typename Config>
absl::Status ReadShapeFlags(const ArgParser& a, Config& c) {
  return ReadIntFlags(a, {{"hidden-size", &c.hidden_size}, {"layers", &c.num_hidden_layers},
                          {"state-size", &c.state_size}, {"conv-kernel", &c.conv_kernel},
                          {"expand", &c.expand}, {"vocab-size", &c.vocab_size}});
}

}  // namespace

absl::StatusOr<MambaConfig> ConfigFromFlags(const ArgParser& a) {
  MambaConfig c;
  if (absl::Status s = ReadShapeFlags(a, c); !s.ok()) return s;
  if (a.Get("dt-rank") == "auto") {
    c.time_step_rank = (c.hidden_size + 15) / 16;
  } else {
    absl::StatusOr<int64_t> v = a.GetInt("dt-rank", 1, int64_t{1} << 31);
    if (!v.ok()) return v.status();
    c.time_step_rank = *v;
  }
  absl::StatusOr<double> eps = a.GetDouble("layer-norm-epsilon");
  if (!eps.ok()) return eps.status();
  c.layer_norm_epsilon = *eps;
  c.tie_word_embeddings = !a.GetBool("untied-head");
  if (absl::Status s = ValidateConfig(c); !s.ok()) return s;
  return c;
}

void AddMamba2Flags(ArgParser& a) {
  a.Add("head-dim", "P", "with --model-type mamba2: channels per head (E*D / P heads)", "64");
  a.Add("groups", "G", "with --model-type mamba2: groups sharing B and C (G divides the heads)",
        "1");
}

absl::StatusOr<Mamba2Config> Mamba2ConfigFromFlags(const ArgParser& a) {
  if (a.Get("dt-rank") != "auto") {
    return absl::InvalidArgumentError("--dt-rank is Mamba-1's: a Mamba-2 model has no dt "
                                      "projection (one dt per head from in_proj)");
  }
  Mamba2Config c;
  if (absl::Status s = ReadShapeFlags(a, c); !s.ok()) return s;
  if (absl::Status s = ReadIntFlags(a, {{"head-dim", &c.head_dim}, {"groups", &c.n_groups}});
      !s.ok())
    return s;
  if (c.inner() % c.head_dim != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--head-dim ", c.head_dim, " does not divide the inner width E*D = ", c.inner()));
  }
  c.num_heads = c.inner() / c.head_dim;
  absl::StatusOr<double> eps = a.GetDouble("layer-norm-epsilon");
  if (!eps.ok()) return eps.status();
  c.layer_norm_epsilon = *eps;
  c.tie_word_embeddings = !a.GetBool("untied-head");
  if (absl::Status s = ValidateMamba2Config(c); !s.ok()) return s;
  return c;
}

}  // namespace adjsh::cli
