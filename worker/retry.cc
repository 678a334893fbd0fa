#include "worker/retry.h"

#include <algorithm>
#include <cstdint>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace adjsh::worker {

using std::chrono::milliseconds;

bool IsFatal(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kUnimplemented ||
         code == absl::StatusCode::kPermissionDenied ||
         code == absl::StatusCode::kUnauthenticated;
}

bool IsTransient(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kAborted;
}

void SetDeadline(grpc::ClientContext& ctx, milliseconds d) {
  ctx.set_deadline(std::chrono::system_clock::now() + d);
}

std::string ConnectHint(const absl::Status& s, bool tls) {
  if (!tls || s.code() != absl::StatusCode::kUnavailable) return "";
  const absl::string_view m = s.message();
  if (absl::StrContains(m, "certificate verify failed")) {
    return "this worker does not trust the coordinator's certificate: --tls-ca must be the CA "
           "that signed it, and the name it carries the host of --coordinator (or "
           "--tls-server-name)";
  }
  if (absl::StrContains(m, "Socket closed") || absl::StrContains(m, "Connection reset")) {
    return "with TLS this is most often the coordinator refusing this worker's certificate: "
           "--tls-cert must be signed by the CA the coordinator trusts (its --tls-ca)";
  }
  return "";
}

int FailureRun::Count(Clock::time_point now) {
  if (failures_++ == 0) first_ = next_note_ = now;
  last_ = now;
  if (now < next_note_) return 2;
  next_note_ = now + std::chrono::minutes(1);
  return 1;
}

std::string FailureRun::Progress() const {
  if (failures_ <= 1) return "";
  return absl::StrFormat(" (try %d, failing for %d s)", failures_,
                         std::chrono::duration_cast<std::chrono::seconds>(last_ - first_).count());
}

std::string FailureRun::Line(absl::string_view call, const absl::Status& s, bool tls) const {
  const std::string hint = ConnectHint(s, tls);
  return absl::StrCat(call, " failed (", s.ToString(), ")", hint.empty() ? "" : "; ", hint,
                      "; retrying", Progress());
}

milliseconds Backoff::Next() {
  static thread_local std::mt19937 rng(std::random_device{}());
  const milliseconds wait = next_;
  next_ = std::min(max_, next_ * 2);
  // +-20 % jitter, so that workers cut off together do not come back in lockstep.
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  return milliseconds(static_cast<int64_t>(static_cast<double>(wait.count()) * jitter(rng)));
}

}  // namespace adjsh::worker
