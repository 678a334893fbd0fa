#include "coordinator/worker_wait.h"

#include "absl/strings/str_cat.h"

namespace adjsh::coordinator {

namespace {

std::string Seconds(absl::Duration d) {
  return absl::StrCat(absl::ToInt64Seconds(d), " s");
}

}  // namespace

void WorkerWaitNote::Reset(absl::Time now) {
  none_since_ = now;  // a new job has had no worker yet: its wait counts from its start
  noted_ = false;
}

std::string WorkerWaitNote::Update(absl::Time now, int64_t connected, int64_t live) {
  if (live > 0) {
    none_since_ = absl::InfinitePast();
    if (!noted_) return "";
    noted_ = false;
    return absl::StrCat("workers are back: ", live, live == 1 ? " is" : " are",
                        " taking tasks; the job goes on");
  }
  if (none_since_ == absl::InfinitePast()) none_since_ = now;
  if (noted_ || now - none_since_ < after_) return "";
  noted_ = true;
  const std::string waited = Seconds(now - none_since_);
  if (connected == 0) {
    return absl::StrCat("waiting for workers: none connected for ", waited,
                        command_.empty()
                            ? "; the job's steps run on `adjsh worker` processes connected to "
                              "this coordinator"
                            : absl::StrCat("; start one with `", command_, "`"));
  }
  return absl::StrCat("waiting for workers: the ", connected, " connected ",
                      connected == 1 ? "one gets" : "ones get",
                      " no tasks (each sent non-finite results, or skipped tasks, too often), "
                      "none has taken tasks for ", waited, "; start other workers");
}

}  // namespace adjsh::coordinator
