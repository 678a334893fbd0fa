// adjsh: adjoint-sharded training of Mamba language models on very long contexts.
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/build_info.h"

namespace {

constexpr const char* kUsage =
    "usage: adjsh <command> [flags]\n"
    "\n"
    "Exact gradients of Mamba language models on very long contexts by adjoint sharding.\n"
    "\n"
    "commands:\n"
    "  cancel     cancel a job of a coordinator (--job ID)\n"
    "  coordinator  serve training jobs (JobService) and their span tasks (TaskService) over gRPC\n"
    "  eval       held-out loss and perplexity of a model on a token file (forward only)\n"
    "  generate   continue a prompt with a model (recurrent decoding, sampling)\n"
    "  grad       loss and gradient of one token sequence (in-process, chunked, threaded)\n"
    "  health     ask a coordinator's or worker's --health-listen endpoint for its status\n"
    "  init       write a new model directory (config.json + model.safetensors)\n"
    "  plan       print the span plan of a step (spans, tasks, dependencies) as JSON\n"
    "  prepare    tokenize text corpora (txt, jsonl, parquet) with a Hugging Face tokenizer\n"
    "  status     show the jobs of a coordinator, or one (--job ID)\n"
    "  submit     submit a training job to a coordinator; prints its id\n"
    "  tokenizer  encode text to a token file, or decode one (a Hugging Face tokenizer)\n"
    "  tokenize   turn text files into a byte-level token file (.u16 / .u32)\n"
    "  train      train on a corpus, one long sequence per step (AdamW, checkpoints, resume)\n"
    "  watch      follow a job's progress until it ends (exit 0 when it SUCCEEDED)\n"
    "  worker     own spans of a coordinator's steps and run their (layer, span) tasks over gRPC\n"
    "\n"
    "Run 'adjsh <command> --help' for a command's flags; 'adjsh --version' for the build.\n";

struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>&);
};
constexpr Command kCommands[] = {
    {"cancel", adjsh::cli::CancelCommand},
    {"coordinator", adjsh::cli::CoordinatorCommand},
    {"eval", adjsh::cli::EvalCommand},
    {"generate", adjsh::cli::GenerateCommand},
    {"grad", adjsh::cli::GradCommand},
    {"health", adjsh::cli::HealthCommand},
    {"init", adjsh::cli::InitCommand},
    {"plan", adjsh::cli::PlanCommand},
    {"prepare", adjsh::cli::PrepareCommand},
    {"status", adjsh::cli::StatusCommand},
    {"submit", adjsh::cli::SubmitCommand},
    {"tokenize", adjsh::cli::TokenizeCommand},
    {"tokenizer", adjsh::cli::TokenizerCommand},
    {"train", adjsh::cli::TrainCommand},
    {"watch", adjsh::cli::WatchCommand},
    {"worker", adjsh::cli::WorkerCommand},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "--version" || command == "version") {
    std::printf("adjsh %s (revision %s, %s)\n", adjsh::kAdjshVersion, adjsh::kAdjshRevision,
                adjsh::kAdjshCuda ? "CUDA backend built" : "CPU only");
    return 0;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  for (const Command& c : kCommands) {
    if (command != c.name) continue;
    // Memory the checks before an allocation could not foresee (a model or data set bigger
    // than the machine) ends the command with a message, not an abort.
    try {
      return c.run(args);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "adjsh %s: out of memory\n", c.name);
    } catch (const std::length_error& e) {
      std::fprintf(stderr, "adjsh %s: out of memory (%s)\n", c.name, e.what());
    }
    return 1;
  }
  std::fprintf(stderr, "adjsh: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
