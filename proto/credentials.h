// Transport security of adjsh's gRPC endpoints (docs/SECURITY.md): TLS with the coordinator's
// certificate, client certificates for workers (mutual TLS), a bearer token for the job API.
//
//   coordinator: ServerSecurity{tls = LoadTlsFiles({cert, key, ca}), job_token = ...}
//                -> ServerCredentialsFor(sec): TLS, client certificates of `ca` requested and
//                verified when presented, every call authorized by auth_policy.h
//   worker:      ClientSecurity{tls = LoadTlsFiles({cert, key, ca})} -> ChannelCredentialsFor
//   job client:  ClientSecurity{tls = LoadTlsFiles({"", "", ca}), token = ...}
//   plaintext:   insecure = true on both ends, only for loopback addresses (IsLoopbackAddress):
//                `adjsh coordinator --insecure-local` and the local clusters of train/grad.
//
// File checks name the flag and the file: unreadable, not PEM, no certificate or key in it, a
// key that does not belong to the certificate (INVALID_ARGUMENT / NOT_FOUND).
#ifndef ADJSH_PROTO_CREDENTIALS_H_
#define ADJSH_PROTO_CREDENTIALS_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace adjsh {

// PEM file paths of one end; empty = not given.
struct TlsFiles {
  std::string cert;  // this end's certificate (chain), leaf first
  std::string key;   // its private key
  std::string ca;    // the CA that signs the other end's certificates
};

// The PEM text of the files, checked.
struct TlsMaterial {
  std::string cert_pem, key_pem, ca_pem;
};

// Reads and checks the given files: each must be readable PEM; cert and key come together and
// must match; ca must hold at least one certificate. Flag names in messages: --tls-cert,
// --tls-key, --tls-ca.
absl::StatusOr<TlsMaterial> LoadTlsFiles(const TlsFiles& files);

// A bearer token from FILE (whitespace around it stripped) or, with an empty path, from the
// environment variable kAuthTokenEnv. Tokens are 16..4096 printable ASCII characters without
// spaces. NOT_FOUND when neither is given; INVALID_ARGUMENT for a bad file or token.
inline constexpr const char* kAuthTokenEnv = "ADJSH_AUTH_TOKEN";
absl::StatusOr<std::string> LoadAuthToken(const std::string& path);
absl::Status CheckAuthToken(std::string_view token);

struct ServerSecurity {
  bool insecure = false;  // plaintext, no authentication: loopback listen addresses only
  TlsMaterial tls;        // cert + key of the server, ca of the workers' client certificates
  std::string job_token;  // bearer token of the JobService
};

struct ClientSecurity {
  bool insecure = false;  // plaintext: loopback coordinators only
  TlsMaterial tls;        // ca: the coordinator's CA; cert + key: a worker's client certificate
  std::string token;      // bearer token sent with every call (job clients); empty = none
  // With TLS: the name the coordinator's certificate must carry, checked instead of the host
  // of the address dialled (a port-forward to localhost, a pod dialled by IP); "": the host.
  std::string server_name;
};

// True for 127.0.0.0/8, ::1 and localhost, with or without a port ("127.0.0.1:0",
// "[::1]:50051", "localhost:7"), and for Unix sockets ("unix:/path").
bool IsLoopbackAddress(std::string_view host_port);

// TLS server credentials with the auth policy of auth_policy.h installed (or insecure ones).
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const ServerSecurity& security);
// TLS channel credentials (+ the bearer token as call credentials), or insecure ones.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const ClientSecurity& security);

}  // namespace adjsh

#endif  // ADJSH_PROTO_CREDENTIALS_H_
