// What `adjsh train` shows of each step: the progress line on stderr and, with --log-jsonl, one
// JSON object per step appended to a file.
#ifndef ADJSH_CLI_TRAIN_REPORT_H_
#define ADJSH_CLI_TRAIN_REPORT_H_

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "train/trainer.h"

namespace adjsh::cli {

// step 12/60 [#####...] loss 3.4121 | 8.1K tok/s | |g| 0.412 | lr 2.95e-03 | ETA 1m32s
//   (| val 3.5120 ppl 33.5 on evaluated steps, then the span schedule's figures)
void PrintProgress(const train::StepReport& r);

// One line per step: {"step", "steps", "loss", "grad_norm", "lr", "seconds", "tokens_per_s",
// "targets", and "val_loss", "val_ppl", "val_tokens", "val_seconds" on evaluated steps}.
std::string StepJson(const train::StepReport& r);

// A JSONL file opened for appending (a resumed run continues it); each line is flushed. After
// a failed write nothing more is written, and status() says why.
class StepLog {
 public:
  static absl::StatusOr<StepLog> Open(const std::string& path);
  StepLog(StepLog&& other) noexcept
      : f_(other.f_), path_(std::move(other.path_)), status_(other.status_) {
    other.f_ = nullptr;
  }
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;
  ~StepLog();
  void Write(const train::StepReport& r);
  const absl::Status& status() const { return status_; }

 private:
  StepLog(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::FILE* f_;
  std::string path_;
  absl::Status status_;
};

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_TRAIN_REPORT_H_
