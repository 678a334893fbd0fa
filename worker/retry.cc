#include "worker/retry.h"

#include <algorithm>
#include <cstdint>
#include <random>

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

milliseconds Backoff::Next() {
  static thread_local std::mt19937 rng(std::random_device{}());
  const milliseconds wait = next_;
  next_ = std::min(max_, next_ * 2);
  // +-20 % jitter, so that workers cut off together do not come back in lockstep.
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  return milliseconds(static_cast<int64_t>(static_cast<double>(wait.count()) * jitter(rng)));
}

}  // namespace adjsh::worker
