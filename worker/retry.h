// The worker's RPC policy: every call has a deadline; which failures end the worker, which are
// worth another try; and the backoff between tries.
//
//   Backoff backoff(opt.backoff_min, opt.backoff_max);
//   for (;;) { ... if (!IsTransient(s.code())) break; SleepFor(backoff.Next()); }
#ifndef ADJSH_WORKER_RETRY_H_
#define ADJSH_WORKER_RETRY_H_

#include <chrono>

#include "absl/status/status.h"
#include "grpcpp/client_context.h"

namespace adjsh::worker {

// A coordinator that answers these will not take this worker however often it asks.
bool IsFatal(absl::StatusCode code);

// Worth trying again after a pause: the coordinator is (re)starting, overloaded or slow.
bool IsTransient(absl::StatusCode code);

void SetDeadline(grpc::ClientContext& ctx, std::chrono::milliseconds d);

// The waits between tries: `min`, doubling up to `max`, each with +-20 % jitter.
class Backoff {
 public:
  Backoff(std::chrono::milliseconds min, std::chrono::milliseconds max)
      : min_(min), max_(max), next_(min) {}

  std::chrono::milliseconds Next();  // the wait before the next try
  void Reset() { next_ = min_; }     // after a success

 private:
  std::chrono::milliseconds min_, max_, next_;
};

}  // namespace adjsh::worker

#endif  // ADJSH_WORKER_RETRY_H_
