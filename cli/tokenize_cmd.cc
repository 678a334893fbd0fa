// adjsh tokenize: byte-level tokens (vocabulary 256) from text files, concatenated in order.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/tokens.h"

namespace adjsh::cli {

int TokenizeCommand(const std::vector<std::string>& args) {
  ArgParser a("tokenize",
              "Concatenates text files as bytes into a token file (token id = byte value,\n"
              "vocabulary 256), optionally cut or repeated to an exact length.");
  a.Add("text", "FILE[,FILE...]", "input files, comma-separated", "", true);
  a.Add("out", "FILE", "output token file (.u16 or .u32)", "", true);
  a.Add("length", "T", "exact number of tokens (repeat the text or cut it); 0: all", "0");
  if (auto code = ParseOrExit(a, args)) return *code;

  absl::StatusOr<int64_t> length = a.GetInt("length", 0, int64_t{1} << 40);
  if (!length.ok()) return BadUsage("tokenize", length.status());
  if (absl::Status s = CheckOutputFile("out", a.Get("out")); !s.ok()) {
    return BadUsage("tokenize", s);
  }
  const std::vector<std::string> paths = absl::StrSplit(a.Get("text"), ',', absl::SkipEmpty());
  absl::StatusOr<std::vector<uint32_t>> text = ReadTextAsBytes(paths);
  if (!text.ok()) return Fail("tokenize", text.status());
  std::vector<uint32_t> tokens = std::move(*text);
  if (*length > 0) {
    std::vector<uint32_t> out(*length);
    for (int64_t t = 0; t < *length; ++t) out[t] = tokens[t % tokens.size()];
    tokens.swap(out);
  }
  if (absl::Status s = WriteTokenFile(a.Get("out"), tokens); !s.ok()) return Fail("tokenize", s);
  std::fprintf(stderr, "%zu tokens -> %s\n", tokens.size(), a.Get("out").c_str());
  return 0;
}

}  // namespace adjsh::cli
