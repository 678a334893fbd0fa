// adjsh eval: the held-out loss of a model on a token file, forward only (engine/evaluate.h).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <type_traits>

#include "absl/strings/str_format.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device_flags.h"
#include "engine/families/families.h"
#include "common/model.h"
#include "common/proc_stats.h"
#include "common/token_data.h"
#include "engine/evaluate.h"

namespace adjsh::cli {
namespace {

// The loss of a model of any type (engine/evaluate.h).
template <typename T>
absl::StatusOr<EvalResult> EvaluateDir(const std::string& dir, const TokenData& tokens,
                                       const EvalOptions& o) {
  return VisitFamily(ModelTypeOfFolder(dir), [&](auto family) -> absl::StatusOr<EvalResult> {
    auto params = decltype(family)::template Load<T>(dir);
    if (!params.ok()) return params.status();
    return Evaluate<T>(*params, tokens, o);
  });
}

template <typename T>
absl::Status RunEval(const ArgParser& a, const EvalOptions& opt, bool quiet) {
  absl::StatusOr<TokenData> tokens = TokenData::Map(a.Get("tokens"));
  if (!tokens.ok()) return tokens.status();
  EvalOptions o = opt;
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  if (!quiet) {
    o.progress = [&](int64_t done, int64_t total) {
      const auto now = std::chrono::steady_clock::now();
      if (done < total && now - last < std::chrono::seconds(1)) return;
      last = now;
      const double s = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "  eval %lld/%lld tokens (%.0f%%)  %.0f tokens/s\n",
                   static_cast<long long>(done), static_cast<long long>(total),
                   100.0 * static_cast<double>(done) / static_cast<double>(total),
                   static_cast<double>(done) / std::max(s, 1e-9));
    };
  }
  absl::StatusOr<EvalResult> r = EvaluateDir<T>(a.Get("model"), *tokens, o);
  if (!r.ok()) return r.status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Every digit of the precision computed in: 9 for f32, 17 for f64 (the check mode).
  std::printf("loss %.*g ppl %.6g tokens %lld\n", std::is_same_v<T, double> ? 17 : 9, r->loss(),
              std::exp(r->loss()), static_cast<long long>(r->tokens));
  if (!quiet) {
    std::fprintf(stderr,
                 "%lld targets in %lld sequence(s), %.2f s, %.0f tokens/s, peak RSS %.1f MiB\n",
                 static_cast<long long>(r->targets), static_cast<long long>(r->sequences),
                 seconds, static_cast<double>(r->tokens) / std::max(seconds, 1e-9),
                 PeakResidentBytes() / 1048576.0);
  }
  return absl::OkStatus();
}

}  // namespace

int EvalCommand(const std::vector<std::string>& args) {
  ArgParser a("eval",
              "Prints the mean next-token loss of a model on a token file, its perplexity and the\n"
              "tokens read: 'loss L ppl P tokens N' on stdout. Forward only, chunk by chunk:\n"
              "nothing per token is kept, so memory is bounded by the chunk at any context.\n"
              "The file is one sequence, or sequences of --context tokens (the last shorter).");
  a.Add("model", "DIR", "model directory: config.json + model.safetensors", "", true);
  a.Add("tokens", "FILE", "token ids, raw little-endian .u32 or .u16 (mapped, never read whole)",
        "", true);
  a.Add("context", "T", "tokens per sequence (0: the whole file is one sequence)", "0");
  a.Add("max-tokens", "M", "only the file's first M tokens (0: all)", "0");
  a.Add("chunk", "C", "tokens per chunk (one kernel call)", "256");
  a.Add("threads", "N", "threads (0: one per core)", "0");
  a.Add("dtype", "f32|f64", "compute precision (f64: the check mode)", "f32");
  AddDeviceFlags(a, "the forward and the head");
  a.AddBool("quiet", "print only the result line");
  if (auto code = ParseOrExit(a, args)) return *code;

  EvalOptions opt;
  absl::StatusOr<Device> device = DeviceFromFlags(a);
  if (!device.ok()) return BadUsage("eval", device.status());
  opt.device = *device;
  absl::StatusOr<int64_t> chunk = a.GetInt("chunk", 1, int64_t{1} << 40);
  if (!chunk.ok()) return BadUsage("eval", chunk.status());
  opt.chunk = *chunk;
  absl::StatusOr<int64_t> context = a.GetInt("context", 0, int64_t{1} << 40);
  if (!context.ok()) return BadUsage("eval", context.status());
  if (*context == 1) {
    return BadUsage("eval", absl::InvalidArgumentError(
                                "--context must be >= 2 tokens (or 0: the whole file)"));
  }
  opt.context = *context;
  absl::StatusOr<int64_t> max_tokens = a.GetInt("max-tokens", 0, int64_t{1} << 40);
  if (!max_tokens.ok()) return BadUsage("eval", max_tokens.status());
  opt.max_tokens = *max_tokens;
  absl::StatusOr<int64_t> threads = a.GetInt("threads", 0, 4096);
  if (!threads.ok()) return BadUsage("eval", threads.status());
  opt.threads = static_cast<int>(*threads);
  const std::string dtype = a.Get("dtype");
  if (dtype != "f32" && dtype != "f64") {
    return BadUsage("eval", absl::InvalidArgumentError("--dtype must be f32 or f64, got '" +
                                                       dtype + "'"));
  }
  if (absl::Status s = CheckDeviceUsable(opt.device); !s.ok()) return Fail("eval", s);
  const bool quiet = a.GetBool("quiet");
  const absl::Status status =
      dtype == "f32" ? RunEval<float>(a, opt, quiet) : RunEval<double>(a, opt, quiet);
  return status.ok() ? 0 : Fail("eval", status);
}

}  // namespace adjsh::cli
