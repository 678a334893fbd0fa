// adjsh prepare / adjsh tokenizer: the data tools of scripts/adjsh_data.py (cli/data_tool.h).
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/data_tool.h"

namespace adjsh::cli {

int PrepareCommand(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"prepare"};
  all.insert(all.end(), args.begin(), args.end());
  return ExecDataTool("prepare", all);
}

// adjsh tokenizer encode|decode ...: text to a token file and back.
int TokenizerCommand(const std::vector<std::string>& args) {
  if (args.empty() || (args[0] != "encode" && args[0] != "decode")) {
    const bool help = !args.empty() && (args[0] == "--help" || args[0] == "-h");
    std::fprintf(help ? stdout : stderr,
                 "usage: adjsh tokenizer encode --tokenizer PATH (--text STR | --text-file F) "
                 "--out FILE.u16|FILE.u32\n"
                 "       adjsh tokenizer decode --tokenizer PATH --tokens FILE.u16|FILE.u32\n"
                 "PATH: a tokenizer.json, or a model folder holding one.\n");
    return help ? 0 : 2;
  }
  return ExecDataTool("tokenizer", args);
}

}  // namespace adjsh::cli
