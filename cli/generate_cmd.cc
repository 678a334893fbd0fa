// adjsh generate: recurrent decoding from a prompt (engine/generate.h); text through a Hugging
// Face tokenizer (cli/data_tool.h) or token ids.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/data_tool.h"
#include "cli/device_flags.h"
#include "engine/families/families.h"
#include "common/model.h"
#include "common/tokens.h"
#include "engine/generate.h"

namespace adjsh::cli {
namespace {

// A private temporary directory, removed with the object.
struct TempDir {
  std::string path;
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string t = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/adjsh-gen-XXXXXX";
    if (::mkdtemp(t.data()) != nullptr) path = t;
  }
  ~TempDir() {
    if (path.empty()) return;
    for (const char* f : {"/prompt.u32", "/out.u32"}) ::unlink((path + f).c_str());
    ::rmdir(path.c_str());
  }
};

// An --out of 16-bit ids cannot hold a vocabulary over 65536: refused once the model is
// loaded, before any token is generated (out_width: TokenIdWidth of --out, 0 without one).
absl::Status CheckOutWidth(int out_width, int64_t vocab_size) {
  if (out_width != 2 || vocab_size <= 65536) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--out is a .u16 file, but the model's vocabulary has ", vocab_size,
      " ids (more than 65536): use .u32"));
}

// A model's tokens, of any type (engine/generate.h).
absl::StatusOr<std::vector<uint32_t>> GenerateFromDir(const std::string& dir,
                                                      std::span<const uint32_t> prompt,
                                                      const GenerateOptions& opt, int out_width,
                                                      const std::function<bool(uint32_t)>& on) {
  return VisitFamily(ModelTypeOfFolder(dir),
                     [&](auto family) -> absl::StatusOr<std::vector<uint32_t>> {
                       auto params = decltype(family)::template Load<float>(dir);
                       if (!params.ok()) return params.status();
                       if (absl::Status s = CheckOutWidth(out_width, params->config.vocab_size);
                           !s.ok())
                         return s;
                       return Generate<float>(*params, prompt, opt, on);
                     });
}

absl::Status RunGenerate(const ArgParser& a, const GenerateOptions& opt) {
  TempDir tmp;
  if (tmp.path.empty()) return absl::InternalError("cannot create a temporary directory");
  const bool text = a.Has("prompt");
  std::string prompt_path = a.Get("prompt-tokens");
  if (text) {  // the prompt's ids from the tokenizer
    prompt_path = tmp.path + "/prompt.u32";
    absl::StatusOr<std::string> out =
        RunDataTool({"encode", "--tokenizer", a.Get("tokenizer"), "--text", a.Get("prompt"),
                     "--out", prompt_path});
    if (!out.ok()) return out.status();
  }
  absl::StatusOr<std::vector<uint32_t>> prompt = ReadTokenFile(prompt_path);
  if (!prompt.ok()) return prompt.status();
  const auto start = std::chrono::steady_clock::now();
  const int out_width = a.Has("out") ? TokenIdWidth(a.Get("out")).value_or(4) : 0;
  absl::StatusOr<std::vector<uint32_t>> ids = GenerateFromDir(
      a.Get("model"), *prompt, opt, out_width, [&](uint32_t id) {
        if (!text) std::printf("%u\n", id), std::fflush(stdout);
        return true;
      });
  if (!ids.ok()) return ids.status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (a.Has("out")) {
    if (absl::Status s = WriteTokenFile(a.Get("out"), *ids); !s.ok()) return s;
  }
  if (text) {
    const std::string out_path = tmp.path + "/out.u32";
    if (absl::Status s = WriteTokenFile(out_path, *ids); !s.ok()) return s;
    absl::StatusOr<std::string> decoded =
        RunDataTool({"decode", "--tokenizer", a.Get("tokenizer"), "--tokens", out_path});
    if (!decoded.ok()) return decoded.status();
    std::fputs(decoded->c_str(), stdout);
    if (decoded->empty() || decoded->back() != '\n') std::fputc('\n', stdout);
  }
  if (!a.GetBool("quiet")) {
    std::fprintf(stderr, "%zu prompt tokens, %zu new in %.2f s (%.1f tokens/s)\n",
                 prompt->size(), ids->size(), seconds,
                 static_cast<double>(ids->size()) / std::max(seconds, 1e-9));
  }
  return absl::OkStatus();
}

}  // namespace

int GenerateCommand(const std::vector<std::string>& args) {
  ArgParser a("generate",
              "Continues a prompt with a model, one token at a time (recurrent decoding: constant\n"
              "work and memory per token). With --prompt and --tokenizer the text is encoded and\n"
              "the new tokens are printed decoded; with --prompt-tokens the new ids are printed\n"
              "one per line.");
  a.Add("model", "DIR", "model directory: config.json + model.safetensors", "", true);
  a.Add("prompt", "TEXT", "the prompt as text (needs --tokenizer)");
  a.Add("tokenizer", "FILE", "tokenizer.json, or a model folder holding one");
  a.Add("prompt-tokens", "FILE", "the prompt as a token file (.u32/.u16)");
  a.Add("max-new-tokens", "N", "tokens to generate", "64");
  a.Add("temperature", "T", "sampling temperature (0: greedy)", "1.0");
  a.Add("top-k", "K", "sample among the K most likely tokens only (0: all)", "0");
  a.Add("seed", "S", "the sampler's seed (the same seed, the same tokens)", "0");
  a.Add("stop-id", "ID", "stop after generating this token id (e.g. the EOS id)");
  a.Add("out", "FILE", "also write the new ids as a token file (.u32/.u16)");
  AddDeviceFlags(a, "the layers");
  a.AddBool("quiet", "print only the generated text or ids");
  if (auto code = ParseOrExit(a, args)) return *code;

  if (a.Has("prompt") == a.Has("prompt-tokens")) {
    return BadUsage("generate", absl::InvalidArgumentError(
                                    "give --prompt TEXT (with --tokenizer) or --prompt-tokens FILE"));
  }
  if (a.Has("prompt") && !a.Has("tokenizer")) {
    return BadUsage("generate", absl::InvalidArgumentError("--prompt needs --tokenizer FILE"));
  }
  if (a.Has("prompt-tokens") && a.Has("tokenizer")) {  // it would be ignored: ids in, ids out
    return BadUsage("generate", absl::InvalidArgumentError(
                                    "--tokenizer goes with --prompt TEXT; --prompt-tokens FILE "
                                    "gives and prints token ids"));
  }
  GenerateOptions opt;
  absl::StatusOr<Device> device = DeviceFromFlags(a);
  if (!device.ok()) return BadUsage("generate", device.status());
  opt.device = *device;
  absl::StatusOr<int64_t> n = a.GetInt("max-new-tokens", 0, int64_t{1} << 40);
  if (!n.ok()) return BadUsage("generate", n.status());
  opt.max_new_tokens = *n;
  absl::StatusOr<double> temperature = a.GetDouble("temperature");
  if (!temperature.ok()) return BadUsage("generate", temperature.status());
  if (!(*temperature >= 0)) {
    return BadUsage("generate", absl::InvalidArgumentError("--temperature must be >= 0"));
  }
  opt.temperature = *temperature;
  absl::StatusOr<int64_t> top_k = a.GetInt("top-k", 0, int64_t{1} << 40);
  if (!top_k.ok()) return BadUsage("generate", top_k.status());
  opt.top_k = *top_k;
  absl::StatusOr<int64_t> seed = a.GetInt("seed", 0, INT64_MAX);
  if (!seed.ok()) return BadUsage("generate", seed.status());
  opt.seed = static_cast<uint64_t>(*seed);
  if (a.Has("stop-id")) {
    absl::StatusOr<int64_t> stop = a.GetInt("stop-id", 0, int64_t{1} << 32);
    if (!stop.ok()) return BadUsage("generate", stop.status());
    opt.stop_id = *stop;
  }
  if (a.Has("out")) {
    if (absl::Status s = CheckOutputFile("out", a.Get("out")); !s.ok())
      return BadUsage("generate", s);
    // Its extension too, before any token is generated and printed.
    if (absl::StatusOr<int> width = TokenIdWidth(a.Get("out")); !width.ok())
      return BadUsage("generate", width.status());
    // (A token file's extension is never one of the model's files.)
    if (absl::Status s = CheckOutputIsNotInput(
            "out", a.Get("out"), {{"the --prompt-tokens file", a.Get("prompt-tokens")}});
        !s.ok()) {
      return BadUsage("generate", s);
    }
  }
  if (absl::Status s = CheckDeviceUsable(opt.device); !s.ok()) return Fail("generate", s);
  const absl::Status s = RunGenerate(a, opt);
  return s.ok() ? 0 : Fail("generate", s);
}

}  // namespace adjsh::cli
