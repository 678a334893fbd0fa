// proto/status_util: every canonical code maps to the gRPC code of the same name and back,
// with the message kept; codes outside the canonical set become UNKNOWN, saying which.
#include "proto/status_util.h"

#include <string>

#include "gtest/gtest.h"

namespace adjsh {
namespace {

struct CodePair {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
};

// Written out by name: the mapping must be one-to-one by meaning, not merely by number.
constexpr CodePair kPairs[] = {
    {absl::StatusCode::kOk, grpc::StatusCode::OK},
    {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
    {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
    {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
};

TEST(StatusUtil, TheTableCoversEveryCanonicalCodeOnce) {
  bool seen_absl[17] = {}, seen_grpc[17] = {};
  for (const CodePair& p : kPairs) {
    const int a = static_cast<int>(p.absl_code), g = static_cast<int>(p.grpc_code);
    ASSERT_TRUE(a >= 0 && a < 17 && g >= 0 && g < 17);
    EXPECT_FALSE(seen_absl[a]) << a;
    EXPECT_FALSE(seen_grpc[g]) << g;
    seen_absl[a] = seen_grpc[g] = true;
  }
  for (int i = 0; i < 17; ++i) EXPECT_TRUE(seen_absl[i] && seen_grpc[i]) << i;
}

TEST(StatusUtil, CodesMapOneToOneBothWays) {
  for (const CodePair& p : kPairs) {
    SCOPED_TRACE(absl::StatusCodeToString(p.absl_code));
    EXPECT_EQ(ToGrpcCode(p.absl_code), p.grpc_code);
    EXPECT_EQ(FromGrpcCode(p.grpc_code), p.absl_code);
  }
}

TEST(StatusUtil, AbslToGrpcKeepsCodeAndMessage) {
  for (const CodePair& p : kPairs) {
    SCOPED_TRACE(absl::StatusCodeToString(p.absl_code));
    const std::string msg = "tensor \"u\": chunk at offset 3, expected 6";
    const grpc::Status g = ToGrpcStatus(absl::Status(p.absl_code, msg));
    EXPECT_EQ(g.error_code(), p.grpc_code);
    if (p.absl_code == absl::StatusCode::kOk) {
      EXPECT_TRUE(g.ok());
      EXPECT_EQ(g.error_message(), "");  // absl drops an OK status's message
    } else {
      EXPECT_EQ(g.error_message(), msg);
    }
  }
}

TEST(StatusUtil, GrpcToAbslKeepsCodeAndMessage) {
  for (const CodePair& p : kPairs) {
    SCOPED_TRACE(absl::StatusCodeToString(p.absl_code));
    const std::string msg = "lease expired";
    const absl::Status a =
        FromGrpcStatus(p.grpc_code == grpc::StatusCode::OK ? grpc::Status::OK
                                                           : grpc::Status(p.grpc_code, msg));
    EXPECT_EQ(a.code(), p.absl_code);
    if (p.absl_code != absl::StatusCode::kOk) {
      EXPECT_EQ(a.message(), msg);
    }
  }
}

TEST(StatusUtil, RoundTripsAreIdentity) {
  for (const CodePair& p : kPairs) {
    SCOPED_TRACE(absl::StatusCodeToString(p.absl_code));
    const absl::Status a(p.absl_code, "why: \xe2\x88\x82L/du (utf-8) and\nnewline");
    EXPECT_EQ(FromGrpcStatus(ToGrpcStatus(a)), a);
    const grpc::Status g = p.grpc_code == grpc::StatusCode::OK
                               ? grpc::Status::OK
                               : grpc::Status(p.grpc_code, "no such worker");
    const grpc::Status back = ToGrpcStatus(FromGrpcStatus(g));
    EXPECT_EQ(back.error_code(), g.error_code());
    EXPECT_EQ(back.error_message(), g.error_message());
  }
}

TEST(StatusUtil, NonCanonicalCodesBecomeUnknownAndSaySo) {
  const grpc::Status g = ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "odd"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_NE(g.error_message().find("42"), std::string::npos) << g.error_message();
  EXPECT_NE(g.error_message().find("odd"), std::string::npos) << g.error_message();

  for (int raw : {-1, 17, 99}) {
    SCOPED_TRACE(raw);
    const absl::Status a = FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(raw), "x"));
    EXPECT_EQ(a.code(), absl::StatusCode::kUnknown);
    EXPECT_NE(a.message().find(std::to_string(raw)), absl::string_view::npos) << a.message();
    EXPECT_EQ(ToGrpcCode(static_cast<absl::StatusCode>(raw)), grpc::StatusCode::UNKNOWN);
    EXPECT_EQ(FromGrpcCode(static_cast<grpc::StatusCode>(raw)), absl::StatusCode::kUnknown);
  }
  // A genuine UNKNOWN keeps its message unchanged.
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNKNOWN, "x")).message(), "x");
  EXPECT_EQ(ToGrpcStatus(absl::UnknownError("x")).error_message(), "x");
}

}  // namespace
}  // namespace adjsh
