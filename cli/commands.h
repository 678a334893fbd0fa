// adjsh subcommands. Each takes the arguments after its name and returns the process exit
// code: 0 success, 1 failure (with a message on stderr), 2 bad usage.
#ifndef ADJSH_CLI_COMMANDS_H_
#define ADJSH_CLI_COMMANDS_H_

#include <string>
#include <vector>

namespace adjsh::cli {

int CancelCommand(const std::vector<std::string>& args);
int CoordinatorCommand(const std::vector<std::string>& args);
int EvalCommand(const std::vector<std::string>& args);
int GenerateCommand(const std::vector<std::string>& args);
int GradCommand(const std::vector<std::string>& args);
int HealthCommand(const std::vector<std::string>& args);
int InitCommand(const std::vector<std::string>& args);
int PlanCommand(const std::vector<std::string>& args);
int PrepareCommand(const std::vector<std::string>& args);
int StatusCommand(const std::vector<std::string>& args);
int SubmitCommand(const std::vector<std::string>& args);
int TokenizerCommand(const std::vector<std::string>& args);
int TokenizeCommand(const std::vector<std::string>& args);
int TrainCommand(const std::vector<std::string>& args);
int WatchCommand(const std::vector<std::string>& args);
int WorkerCommand(const std::vector<std::string>& args);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_COMMANDS_H_
