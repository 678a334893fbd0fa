// proto/credentials.h and proto/auth_policy.h: certificate and token files (every way they can
// be wrong), the loopback rule, constant-time token comparison, the per-call auth policy, and
// the policy over real TLS: a coordinator's JobService and TaskService behind
// ServerCredentialsFor, called with every mix of client certificate and token. Certificates are
// made fresh for the run by tests/security/make_test_certs.sh (openssl).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/job_service.h"
#include "coordinator/task_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/adjsh.grpc.pb.h"
#include "proto/auth_policy.h"
#include "proto/health.h"
#include "proto/credentials.h"
#include "proto/status_util.h"
#include "proto/transport.h"

namespace adjsh {
namespace {

namespace fs = std::filesystem;

class Certs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        absl::StrCat("adjsh-credentials-test-", ::getpid()));
    const std::string cmd = absl::StrCat(ADJSH_MAKE_TEST_CERTS, " ", dir_->string());
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string F(const std::string& name) { return (*dir_ / name).string(); }
  static std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(*dir_ / name, std::ios::binary) << text;
    return F(name);
  }
  static std::string Read(const std::string& name) {
    std::ifstream in(*dir_ / name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  static fs::path* dir_;
};
fs::path* Certs::dir_ = nullptr;

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& part) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(std::string(s.message()).find(part), std::string::npos)
      << "'" << s.message() << "' does not name '" << part << "'";
}

TEST_F(Certs, LoadsMatchingFiles) {
  absl::StatusOr<TlsMaterial> m = LoadTlsFiles({F("server.pem"), F("server.key"), F("ca.pem")});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->cert_pem, Read("server.pem"));
  EXPECT_EQ(m->key_pem, Read("server.key"));
  EXPECT_EQ(m->ca_pem, Read("ca.pem"));
  absl::StatusOr<TlsMaterial> ca_only = LoadTlsFiles({"", "", F("ca.pem")});
  ASSERT_TRUE(ca_only.ok()) << ca_only.status();
  EXPECT_TRUE(ca_only->cert_pem.empty());
}

TEST_F(Certs, RefusesBadFilesNamingFlagAndFile) {
  ExpectError(LoadTlsFiles({F("missing.pem"), F("server.key"), F("ca.pem")}).status(),
              absl::StatusCode::kNotFound, "--tls-cert");
  ExpectError(LoadTlsFiles({Write("plain.txt", "hello"), F("server.key"), ""}).status(),
              absl::StatusCode::kInvalidArgument, "is not a PEM file");
  const std::string cert = Read("server.pem");
  ExpectError(LoadTlsFiles({Write("corrupt.pem", cert.substr(0, 40) + "AAAA" + cert.substr(44)),
                            F("server.key"), ""})
                  .status(),
              absl::StatusCode::kInvalidArgument, "corrupt");
  ExpectError(LoadTlsFiles({F("server.key"), F("server.key"), ""}).status(),
              absl::StatusCode::kInvalidArgument, "holds no PEM certificate");
  ExpectError(LoadTlsFiles({F("server.pem"), F("server.pem"), ""}).status(),
              absl::StatusCode::kInvalidArgument, "--tls-key");
  ExpectError(LoadTlsFiles({F("server.pem"), F("server-encrypted.key"), ""}).status(),
              absl::StatusCode::kInvalidArgument, "encrypted keys are not supported");
  ExpectError(LoadTlsFiles({F("server.pem"), F("worker.key"), ""}).status(),
              absl::StatusCode::kInvalidArgument, "does not match the certificate");
  ExpectError(LoadTlsFiles({F("server.pem"), "", ""}).status(),
              absl::StatusCode::kInvalidArgument, "go together");
  ExpectError(LoadTlsFiles({"", "", F("server.key")}).status(),
              absl::StatusCode::kInvalidArgument, "--tls-ca");
  ExpectError(LoadTlsFiles({"", "", dir_->string()}).status(),
              absl::StatusCode::kFailedPrecondition, "is a directory");
}

TEST_F(Certs, Tokens) {
  absl::StatusOr<std::string> t = LoadAuthToken(F("token"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "adjsh-test-token-0123456789abcdef");  // the newline stripped
  ExpectError(LoadAuthToken(Write("short", "abc\n")).status(), absl::StatusCode::kInvalidArgument,
              "16 to 4096");
  ExpectError(LoadAuthToken(Write("spaces", "0123456789 abcdefgh")).status(),
              absl::StatusCode::kInvalidArgument, "printable ASCII");
  ExpectError(LoadAuthToken(F("no-such-token")).status(), absl::StatusCode::kNotFound,
              "--auth-token-file");
  ::unsetenv(kAuthTokenEnv);
  ExpectError(LoadAuthToken("").status(), absl::StatusCode::kNotFound, kAuthTokenEnv);
  ::setenv(kAuthTokenEnv, "from-the-environment-0123", 1);
  t = LoadAuthToken("");
  ::unsetenv(kAuthTokenEnv);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "from-the-environment-0123");
}

TEST(Loopback, Addresses) {
  for (const char* a : {"127.0.0.1:0", "127.1.2.3:50051", "127.0.0.1", "localhost:7", "[::1]:80",
                        "::1", "unix:/tmp/x/sock"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:50051", "10.0.0.1:1", "128.0.0.1:1", "[::]:50051",
                        "example.com:1", "127.0.0:1", "127.0.0.1.5:1", "127.0.0.256:1",
                        "localhost.example.com:1", "", "[::1:80"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(ConstantTime, Equality) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret-token", "secret-token"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "secret-tokem"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "secret-token2"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string_view("a\0b", 3), std::string_view("a\0c", 3)));
}

TEST(AuthPolicy, Decisions) {
  const std::string token = "the-job-token-0123456789";
  const std::string bearer = "Bearer " + token;
  const auto code = [&](const char* method, bool cert, std::optional<std::string> auth) {
    std::optional<std::string_view> a;
    if (auth) a = *auth;
    return AuthorizeCall(method, cert, a, token).code();
  };
  using C = absl::StatusCode;
  const char* job = "/adjsh.v1.JobService/SubmitJob";
  const char* task = "/adjsh.v1.TaskService/PullTask";
  EXPECT_EQ(code(job, false, bearer), C::kOk);
  EXPECT_EQ(code(job, true, bearer), C::kOk);
  EXPECT_EQ(code(job, false, std::nullopt), C::kUnauthenticated);
  EXPECT_EQ(code(job, false, "Bearer wrong-token-0123456789"), C::kUnauthenticated);
  EXPECT_EQ(code(job, false, token), C::kUnauthenticated);  // no "Bearer "
  EXPECT_EQ(code(job, false, "Bearer " + token + "x"), C::kUnauthenticated);
  EXPECT_EQ(code(job, true, std::nullopt), C::kPermissionDenied);
  EXPECT_EQ(code(job, true, "Bearer nope"), C::kUnauthenticated);
  EXPECT_EQ(code(task, true, std::nullopt), C::kOk);
  EXPECT_EQ(code(task, false, std::nullopt), C::kUnauthenticated);
  EXPECT_EQ(code(task, false, bearer), C::kPermissionDenied);
  EXPECT_EQ(code(task, false, "Bearer nope"), C::kUnauthenticated);
  for (bool cert : {false, true}) {  // health: any TLS caller, token or not
    EXPECT_EQ(code("/grpc.health.v1.Health/Check", cert, std::nullopt), C::kOk);
    EXPECT_EQ(code("/grpc.health.v1.Health/Watch", cert, "Bearer nope"), C::kOk);
  }
  EXPECT_EQ(code("/grpc.health.v1.HealthX/Check", false, bearer), C::kPermissionDenied);
  EXPECT_EQ(code("", true, bearer), C::kPermissionDenied);
  EXPECT_EQ(code("/adjsh.v1.JobServiceX/Get", false, bearer), C::kPermissionDenied);
}

// A coordinator's two services over TLS on 127.0.0.1, with the policy installed.
class TlsEndToEnd : public Certs {
 protected:
  void SetUp() override {
    absl::StatusOr<TlsMaterial> tls =
        LoadTlsFiles({F("server.pem"), F("server.key"), F("ca.pem")});
    ASSERT_TRUE(tls.ok()) << tls.status();
    ServerSecurity sec{.insecure = false, .tls = *tls, .job_token = *LoadAuthToken(F("token"))};
    tasks_ = std::make_unique<coordinator::TaskServiceImpl>();
    jobs_ = std::make_unique<coordinator::JobServiceImpl>(*tasks_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", ServerCredentialsFor(sec), &port_);
    builder.RegisterService(tasks_.get());
    builder.RegisterService(jobs_.get());
    builder.RegisterService(&health_);
    ConfigureServer(builder, kDefaultMaxMessageBytes);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr && port_ > 0);
  }
  void TearDown() override {
    health_.Stop();
    jobs_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  // A channel trusting `ca`, presenting `cert` (empty: none) and sending `token_file`'s token.
  std::shared_ptr<grpc::Channel> Channel(const std::string& ca, const std::string& cert,
                                         const std::string& token_file) {
    ClientSecurity sec;
    absl::StatusOr<TlsMaterial> tls = LoadTlsFiles(
        {cert.empty() ? "" : F(cert + ".pem"), cert.empty() ? "" : F(cert + ".key"), F(ca)});
    EXPECT_TRUE(tls.ok()) << tls.status();
    sec.tls = *tls;
    if (!token_file.empty()) sec.token = *LoadAuthToken(F(token_file));
    return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_), ChannelCredentialsFor(sec),
                                     ClientChannelArgs());
  }

  absl::Status GetJob(const std::shared_ptr<grpc::Channel>& ch) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetJobRequest req;
    req.set_job_id("job-404");
    v1::Job job;
    return FromGrpcStatus(v1::JobService::NewStub(ch)->GetJob(&ctx, req, &job));
  }
  absl::Status Register(const std::shared_ptr<grpc::Channel>& ch, std::string* id = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RegisterWorkerRequest req;
    req.set_worker_name("w");
    v1::RegisterWorkerResponse resp;
    absl::Status s = FromGrpcStatus(v1::TaskService::NewStub(ch)->RegisterWorker(&ctx, req, &resp));
    if (id) *id = resp.worker_id();
    return s;
  }
  absl::Status Pull(const std::shared_ptr<grpc::Channel>& ch, const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::PullTaskRequest req;
    req.set_worker_id(id);
    v1::PullTaskResponse resp;
    return FromGrpcStatus(v1::TaskService::NewStub(ch)->PullTask(&ctx, req, &resp));
  }

  // One health check of the server over TLS trusting `ca`, presenting `cert` (empty: none).
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(
      const std::string& ca, const std::string& cert) {
    ClientSecurity sec;
    absl::StatusOr<TlsMaterial> tls = LoadTlsFiles(
        {cert.empty() ? "" : F(cert + ".pem"), cert.empty() ? "" : F(cert + ".key"), F(ca)});
    EXPECT_TRUE(tls.ok()) << tls.status();
    sec.tls = *tls;
    return CheckHealth(absl::StrCat("127.0.0.1:", port_), "", 10, ChannelCredentialsFor(sec));
  }

  int port_ = 0;
  HealthService health_;
  std::unique_ptr<coordinator::TaskServiceImpl> tasks_;
  std::unique_ptr<coordinator::JobServiceImpl> jobs_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(TlsEndToEnd, JobApiNeedsTheToken) {
  // Past authentication, the unknown job is NOT_FOUND.
  EXPECT_EQ(GetJob(Channel("ca.pem", "", "token")).code(), absl::StatusCode::kNotFound);
  ExpectError(GetJob(Channel("ca.pem", "", "")), absl::StatusCode::kUnauthenticated,
              "needs a bearer token");
  ExpectError(GetJob(Channel("ca.pem", "", "token-wrong")), absl::StatusCode::kUnauthenticated,
              "refused the bearer token");
  ExpectError(GetJob(Channel("ca.pem", "worker", "")), absl::StatusCode::kPermissionDenied,
              "does not grant the job API");
  EXPECT_EQ(GetJob(Channel("ca.pem", "worker", "token")).code(), absl::StatusCode::kNotFound);
}

TEST_F(TlsEndToEnd, TaskApiNeedsAClientCertificate) {
  EXPECT_TRUE(Register(Channel("ca.pem", "worker", "")).ok());
  ExpectError(Register(Channel("ca.pem", "", "")), absl::StatusCode::kUnauthenticated,
              "client certificate");
  ExpectError(Register(Channel("ca.pem", "", "token")), absl::StatusCode::kPermissionDenied,
              "does not grant the task API");
}

// A worker id is bound to the certificate it registered with: another certificate of the same
// CA that learns the id cannot act as that worker (pull, heartbeat, fetch, push all check it).
// Ids are 128 random bits, so they cannot be guessed from one's own either.
TEST_F(TlsEndToEnd, AWorkerIdIsBoundToItsCertificate) {
  std::string id1, id2;
  ASSERT_TRUE(Register(Channel("ca.pem", "worker", ""), &id1).ok());
  ASSERT_TRUE(Register(Channel("ca.pem", "worker2", ""), &id2).ok());
  EXPECT_EQ(id1.size(), 33u) << id1;
  EXPECT_NE(id1.substr(0, 20), id2.substr(0, 20));
  EXPECT_TRUE(Pull(Channel("ca.pem", "worker", ""), id1).ok());
  ExpectError(Pull(Channel("ca.pem", "worker2", ""), id1), absl::StatusCode::kPermissionDenied,
              "another client certificate");
  ExpectError(Pull(Channel("ca.pem", "worker", ""), id2), absl::StatusCode::kPermissionDenied,
              "another client certificate");
}

TEST_F(TlsEndToEnd, ForeignCertificatesFailTheHandshake) {
  // A client certificate of another CA: the server ends the handshake.
  EXPECT_EQ(Register(Channel("ca.pem", "rogue", "")).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetJob(Channel("ca.pem", "rogue", "token")).code(), absl::StatusCode::kUnavailable);
  // A client that trusts another CA refuses the coordinator's certificate.
  EXPECT_EQ(GetJob(Channel("other-ca.pem", "", "token")).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Register(Channel("other-ca.pem", "worker", "")).code(),
            absl::StatusCode::kUnavailable);
}

// The main port answers grpc.health.v1 under its TLS to any caller that completes the handshake
// (a load balancer has no certificate or token): NOT_SERVING, then SERVING once set. A client
// that does not trust the server's CA, or speaks plaintext, gets no answer.
TEST_F(TlsEndToEnd, HealthAnswersOnTheMainPortUnderTls) {
  using R = grpc::health::v1::HealthCheckResponse;
  absl::StatusOr<R::ServingStatus> before = Health("ca.pem", "");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(*before, R::NOT_SERVING);
  health_.SetServing(true);
  for (const char* cert : {"", "worker"}) {
    absl::StatusOr<R::ServingStatus> s = Health("ca.pem", cert);
    ASSERT_TRUE(s.ok()) << cert << ": " << s.status();
    EXPECT_EQ(*s, R::SERVING) << cert;
  }
  EXPECT_EQ(Health("other-ca.pem", "").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CheckHealth(absl::StrCat("127.0.0.1:", port_), "", 10).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(TlsEndToEnd, PlaintextClientsAreRefused) {
  auto ch = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                grpc::InsecureChannelCredentials());
  EXPECT_EQ(GetJob(ch).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Register(ch).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace adjsh
