// worker/retry.h: what a failed connection's log line adds (ConnectHint), and how often a run of
// failures is logged (FailureRun), with the time passed in.
#include "worker/retry.h"

#include <chrono>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace adjsh::worker {
namespace {

TEST(ConnectHintTest, NamesTheCertificateThatATlsHandshakeRefused) {
  // The messages gRPC gives (seen with tests/security/make_test_certs.sh's certificates).
  const absl::Status refused = absl::UnavailableError(
      "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Socket "
      "closed");
  const absl::Status untrusted = absl::UnavailableError(
      "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Ssl handshake "
      "failed: SSL_ERROR_SSL: error:0A000086:SSL routines::certificate verify failed");
  EXPECT_TRUE(absl::StrContains(ConnectHint(refused, true), "--tls-cert must be signed"));
  EXPECT_TRUE(absl::StrContains(ConnectHint(untrusted, true), "does not trust the coordinator"));
  // Plaintext: a closed socket is a coordinator going away, nothing about certificates.
  EXPECT_EQ(ConnectHint(refused, false), "");
  EXPECT_EQ(ConnectHint(absl::UnavailableError("Connection refused"), true), "");
  EXPECT_EQ(ConnectHint(absl::DeadlineExceededError("Socket closed"), true), "");
}

TEST(FailureRunTest, TheFirstFailureAndOneAMinuteAreWorthALine) {
  using std::chrono::milliseconds;
  const FailureRun::Clock::time_point t0{};
  FailureRun run;
  EXPECT_EQ(run.Count(t0), 1);
  EXPECT_EQ(run.Progress(), "");
  EXPECT_EQ(run.Count(t0 + milliseconds(100)), 2);
  EXPECT_EQ(run.Count(t0 + milliseconds(59999)), 2);
  EXPECT_EQ(run.Count(t0 + milliseconds(60000)), 1);
  EXPECT_EQ(run.Progress(), " (try 4, failing for 60 s)");
  EXPECT_EQ(run.Line("PullTask", absl::UnavailableError("Connection refused"), false),
            "PullTask failed (UNAVAILABLE: Connection refused); retrying (try 4, failing for "
            "60 s)");
  EXPECT_EQ(run.Count(t0 + milliseconds(61000)), 2);
  EXPECT_EQ(run.Count(t0 + milliseconds(120000)), 1);
  run.Reset();  // a success: the next failure starts a run of its own
  EXPECT_EQ(run.failures(), 0);
  EXPECT_EQ(run.Count(t0 + milliseconds(120500)), 1);
  EXPECT_EQ(run.Progress(), "");
}

}  // namespace
}  // namespace adjsh::worker
