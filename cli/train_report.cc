#include "cli/train_report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace adjsh::cli {
namespace {

std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60) : absl::StrFormat("%ds", s);
}

}  // namespace

void PrintProgress(const train::StepReport& r) {
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(kWidth * r.step / r.steps);
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::string more =
      r.correct < 0 ? "" : absl::StrFormat(" | acc %d/%d", r.correct, r.targets);
  if (r.evaluated) more += absl::StrFormat(" | val %.4f ppl %.1f", r.val_loss, std::exp(r.val_loss));
  if (r.profile.tasks > 0) {  // the span schedule's parallelism and wire bytes per token
    more += absl::StrFormat(" | par %.1f", r.profile.parallelism);
    if (r.profile.wire_bytes > 0) {
      more += absl::StrFormat(" | wire %.0f B/tok",
                              static_cast<double>(r.profile.wire_bytes) /
                                  static_cast<double>(std::max<int64_t>(1, r.profile.tokens)));
    }
    if (r.profile.tree_workers > 0) more += absl::StrFormat(" | tree of %d", r.profile.tree_workers);
    if (r.profile.restarts > 0) more += absl::StrFormat(" | %d restarts", r.profile.restarts);
  }
  std::fprintf(stderr,
               "step %lld/%lld [%s] loss %.4f | %.1fK tok/s | |g| %.3f | lr %.2e | ETA %s%s\n",
               static_cast<long long>(r.step), static_cast<long long>(r.steps), bar.c_str(),
               r.loss, r.tokens_per_s / 1000, r.grad_norm, r.lr, Duration(r.eta_seconds).c_str(),
               more.c_str());
}

std::string StepJson(const train::StepReport& r) {
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["steps"] = r.steps;
  j["loss"] = r.loss;
  j["grad_norm"] = r.grad_norm;
  j["lr"] = r.lr;
  j["seconds"] = r.seconds;
  j["tokens_per_s"] = r.tokens_per_s;
  j["targets"] = r.targets;
  if (r.correct >= 0) j["correct"] = r.correct;
  if (r.evaluated) {
    j["val_loss"] = r.val_loss;
    j["val_ppl"] = std::exp(r.val_loss);
    j["val_tokens"] = r.val_tokens;
    j["val_seconds"] = r.val_seconds;
  }
  return j.dump();
}

absl::StatusOr<StepLog> StepLog::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open the step log ", path));
  }
  return StepLog(f, path);
}

StepLog::~StepLog() {
  if (f_ != nullptr) std::fclose(f_);
}

void StepLog::Write(const train::StepReport& r) {
  if (!status_.ok()) return;
  const std::string line = StepJson(r) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0) {
    status_ = absl::ErrnoToStatus(errno, absl::StrCat("cannot write the step log ", path_));
  }
}

}  // namespace adjsh::cli
