#include "cli/args.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/address.h"

namespace adjsh::cli {

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void ArgParser::Add(const std::string& name, const std::string& value_name,
                    const std::string& help, const std::string& default_value, bool required) {
  order_.push_back(name);
  flags_[name] = Flag{value_name, help, default_value, false, required};
}

void ArgParser::AddBool(const std::string& name, const std::string& help) {
  order_.push_back(name);
  flags_[name] = Flag{"", help, "", true, false};
}

absl::Status ArgParser::Parse(const std::vector<std::string>& args) {
  for (size_t k = 0; k < args.size(); ++k) {
    const std::string& arg = args[k];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (it->second.is_bool) {
      if (has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      values_[name] = has_value ? value : "true";
      continue;
    }
    if (!has_value) {
      if (k + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value (", it->second.value_name, ")"));
      }
      value = args[++k];
    }
    values_[name] = value;
  }
  if (help_) return absl::OkStatus();
  for (const auto& [name, flag] : flags_) {
    if (flag.required && !values_.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("missing required flag --", name));
    }
  }
  return absl::OkStatus();
}

std::string ArgParser::Usage() const {
  std::string out = absl::StrCat("usage: adjsh ", command_, " [flags]\n\n", summary_, "\n\nflags:\n");
  for (const std::string& name : order_) {
    const Flag& f = flags_.at(name);
    std::string left = absl::StrCat("  --", name, f.is_bool ? "" : absl::StrCat(" ", f.value_name));
    absl::StrAppend(&out, absl::StrFormat("%-30s ", left), f.help);
    if (f.required) absl::StrAppend(&out, " (required)");
    if (!f.default_value.empty()) absl::StrAppend(&out, " [default: ", f.default_value, "]");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, absl::StrFormat("%-30s ", "  --help"), "show this help\n");
  return out;
}

bool ArgParser::Has(const std::string& name) const {
  return values_.contains(name) || !flags_.at(name).default_value.empty();
}

bool ArgParser::Given(const std::string& name) const { return values_.contains(name); }

std::string ArgParser::Get(const std::string& name) const {
  auto it = values_.find(name);
  return it != values_.end() ? it->second : flags_.at(name).default_value;
}

bool ArgParser::GetBool(const std::string& name) const { return Get(name) == "true"; }

absl::StatusOr<int64_t> ArgParser::GetInt(const std::string& name, int64_t min,
                                          int64_t max) const {
  const std::string v = Get(name);
  int64_t out = 0;
  if (!absl::SimpleAtoi(v, &out)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be an integer, got '", v, "'"));
  }
  if (out < min || out > max) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s must be in [%d, %d], got %d", name, min, max, out));
  }
  return out;
}

absl::StatusOr<double> ArgParser::GetDouble(const std::string& name) const {
  const std::string v = Get(name);
  double out = 0;
  if (!absl::SimpleAtod(v, &out)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be a number, got '", v, "'"));
  }
  return out;
}

}  // namespace adjsh::cli

namespace adjsh::cli {

std::optional<int> ParseOrExit(ArgParser& parser, const std::vector<std::string>& args) {
  const absl::Status status = parser.Parse(args);
  if (parser.help()) {
    std::fputs(parser.Usage().c_str(), stdout);
    return 0;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n\n%s", std::string(status.message()).c_str(),
                 parser.Usage().c_str());
    return 2;
  }
  return std::nullopt;
}

int Fail(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "adjsh %s: error: %s\n", command.c_str(),
               std::string(status.message()).c_str());
  return 1;
}

int BadUsage(const std::string& command, const absl::Status& status) {
  Fail(command, status);
  return 2;
}

std::string SelfExe() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("adjsh") : p.string();
}

absl::Status CheckOutputFile(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, " is a directory"));
  }
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": directory ", parent.string(), " does not exist"));
  }
  // Learnt now, not after hours of work: whether a file can be created beside it (a name of
  // its own, so no other file is touched).
  std::string probe = absl::StrCat(path, ".probe.XXXXXX");
  const int fd = mkostemp(probe.data(), O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": cannot create a file in ",
                     parent.empty() ? std::string(".") : parent.string(), ": ",
                     std::strerror(err)));
  }
  close(fd);
  unlink(probe.c_str());
  return absl::OkStatus();
}

absl::Status CheckOutputIsNotInput(
    const std::string& flag, const std::string& path,
    std::initializer_list<std::pair<std::string, std::string>> inputs) {
  namespace fs = std::filesystem;
  std::error_code e1;
  const fs::path out = fs::weakly_canonical(path, e1);
  if (e1) return absl::OkStatus();  // CheckOutputFile reports a path it cannot use
  for (const auto& [what, input] : inputs) {
    if (input.empty()) continue;
    std::error_code e2;
    if (fs::weakly_canonical(input, e2) == out && !e2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " ", path, " is ", what, ": it would be overwritten"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAddressFlag(const std::string& flag, const std::string& value, bool listen) {
  for (const char* scheme : {"unix:", "dns:", "ipv4:", "ipv6:"})
    if (value.rfind(scheme, 0) == 0) return absl::OkStatus();
  if (value.find("://") != std::string::npos) return absl::OkStatus();
  return CheckHostPort(flag, value, listen ? 0 : 1);
}

}  // namespace adjsh::cli
