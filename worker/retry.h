// The worker's RPC policy: every call has a deadline; which failures end the worker, which are
// worth another try; and the backoff between tries.
//
//   Backoff backoff(opt.backoff_min, opt.backoff_max);
//   for (;;) { ... if (!IsTransient(s.code())) break; SleepFor(backoff.Next()); }
#ifndef ADJSH_WORKER_RETRY_H_
#define ADJSH_WORKER_RETRY_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/client_context.h"

namespace adjsh::worker {

// A coordinator that answers these will not take this worker however often it asks.
bool IsFatal(absl::StatusCode code);

// Worth trying again after a pause: the coordinator is (re)starting, overloaded or slow.
bool IsTransient(absl::StatusCode code);

void SetDeadline(grpc::ClientContext& ctx, std::chrono::milliseconds d);

// What a failed try to reach the coordinator most likely means, for the log ("" when nothing
// more than its status can be said). gRPC reports a TLS handshake either side refused as
// UNAVAILABLE, as it does a coordinator that is down, so a worker with the wrong certificates
// retried with no more than "Socket closed" to go on. tls: the worker connects with TLS.
std::string ConnectHint(const absl::Status& s, bool tls);

// A run of failed tries of one call, for the log: the first failure is worth a line, and one a
// minute after it while the run goes on (a worker that cannot reach its coordinator must not
// look like one waiting for tasks); the others only at debug level.
class FailureRun {
 public:
  using Clock = std::chrono::steady_clock;
  // Counts a failure at `now`; the log level for its line: 1 (info) or 2 (debug).
  int Count(Clock::time_point now);
  void Reset() { failures_ = 0; }  // after a success
  int failures() const { return failures_; }
  // For the line of the failure just counted: "" for the first, else " (try N, failing for
  // S s)".
  std::string Progress() const;
  // The log line of the failure s of `call` just counted: "CALL failed (STATUS); HINT;
  // retrying (try N, ...)", with ConnectHint's hint (tls: the worker connects with TLS).
  std::string Line(absl::string_view call, const absl::Status& s, bool tls) const;

 private:
  int failures_ = 0;
  Clock::time_point first_, last_, next_note_;
};

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
