// A small command-line parser for adjsh's subcommands: `--name value`, `--name=value` and
// boolean `--name`; every subcommand declares its flags, which also produce its --help text.
#ifndef ADJSH_CLI_ARGS_H_
#define ADJSH_CLI_ARGS_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace adjsh::cli {

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary);

  // A flag taking a value. An empty default with required = false means "unset".
  void Add(const std::string& name, const std::string& value_name, const std::string& help,
           const std::string& default_value = "", bool required = false);
  void AddBool(const std::string& name, const std::string& help);

  // Parses args (those after the subcommand). INVALID_ARGUMENT for unknown flags, missing values,
  // stray positional arguments and missing required flags (unless --help was given).
  absl::Status Parse(const std::vector<std::string>& args);

  bool help() const { return help_; }
  std::string Usage() const;

  bool Has(const std::string& name) const;  // given on the command line, or has a default
  bool Given(const std::string& name) const;  // given on the command line
  std::string Get(const std::string& name) const;
  bool GetBool(const std::string& name) const;
  // INVALID_ARGUMENT naming the flag when the value is not an integer in [min, max].
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t min, int64_t max) const;
  absl::StatusOr<double> GetDouble(const std::string& name) const;

 private:
  struct Flag {
    std::string value_name, help, default_value;
    bool is_bool = false, required = false;
  };
  std::string command_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, Flag> flags_;
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

// Parses args for a subcommand. Returns an exit code when the command should stop now: 0 after
// printing --help to stdout, 2 after printing a usage error to stderr; nullopt to go on.
std::optional<int> ParseOrExit(ArgParser& parser, const std::vector<std::string>& args);

// Prints "adjsh <command>: error: <status message>" to stderr and returns 1.
int Fail(const std::string& command, const absl::Status& status);
// The same for a bad flag value, and returns 2 (bad usage).
int BadUsage(const std::string& command, const absl::Status& status);

// The path of the running adjsh binary (to start worker processes from it).
std::string SelfExe();

// Checks before any work that an output file can be written: a non-empty path that is not a
// directory, in an existing directory where a file can be created (a probe file beside it,
// PATH.probe.XXXXXX, removed at once: the output is written as a temporary file there and
// renamed). INVALID_ARGUMENT
// naming the flag otherwise.
absl::Status CheckOutputFile(const std::string& flag, const std::string& path);

// INVALID_ARGUMENT when output `path` of --flag is one of the files a command reads, each
// (what, path) with what naming it ("the --tokens file"); empty paths are skipped. Paths are
// compared after weakly_canonical, so ./x, x and a link to x are one file.
absl::Status CheckOutputIsNotInput(
    const std::string& flag, const std::string& path,
    std::initializer_list<std::pair<std::string, std::string>> inputs);

// A gRPC address flag's value: HOST:PORT checked by CheckHostPort (common/address.h), the port
// in [0, 65535] for a server's listen address, [1, 65535] for an address to reach (gRPC took
// '99999' as 34463, and '32955abc' or '+32955' as 32955). A unix: path, or a target with a
// scheme (dns:, ipv4:, ipv6:, or one with ://), is passed on unchecked. INVALID_ARGUMENT naming
// the flag otherwise.
absl::Status CheckAddressFlag(const std::string& flag, const std::string& value, bool listen);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_ARGS_H_
