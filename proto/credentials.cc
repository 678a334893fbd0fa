#include "proto/credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/strings.h"
#include "proto/auth_policy.h"

namespace adjsh {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;

// Never ask for a passphrase: OpenSSL's default callback would prompt on the terminal, which
// hangs a daemon; an encrypted key is refused instead.
int NoPassphrase(char*, int, int, void*) { return 0; }

// PEM files are small; a bigger file is a wrong path, not a certificate.
constexpr size_t kMaxPemBytes = size_t{1} << 20;

Bio MemBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The text of OpenSSL's most recent error, for messages; clears the error queue.
std::string OpenSslError() {
  unsigned long e = ERR_get_error(), last = e;
  while (e != 0) {
    last = e;
    e = ERR_get_error();
  }
  if (last == 0) return "no PEM block found";
  char buf[256];
  ERR_error_string_n(last, buf, sizeof buf);
  return buf;
}

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " is empty"));
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat(flag, " ", path, ": ", text.status().message()));
  }
  if (text->size() > kMaxPemBytes) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is ", text->size(),
                                                   " bytes, too large for a PEM file"));
  }
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, " is not a PEM file (no -----BEGIN line)"));
  }
  return text;
}

// Certificates in a PEM text: at least one, every CERTIFICATE block parseable.
absl::StatusOr<std::vector<std::unique_ptr<X509, X509Free>>> ParseCerts(
    const char* flag, const std::string& path, const std::string& pem) {
  std::vector<std::unique_ptr<X509, X509Free>> certs;
  Bio bio = MemBio(pem);
  ERR_clear_error();
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)) {
    certs.emplace_back(x);
  }
  const unsigned long err = ERR_peek_last_error();
  // Reading stops with "no start line" at the end of the text; anything else is a bad block.
  const bool clean_end = err == 0 || ERR_GET_REASON(err) == PEM_R_NO_START_LINE;
  if (!clean_end) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": a certificate is corrupt (",
                                                   OpenSslError(), ")"));
  }
  ERR_clear_error();
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, " holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
  }
  return certs;
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTlsFiles(const TlsFiles& files) {
  TlsMaterial m;
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both or neither");
  }
  if (!files.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem("--tls-cert", files.cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("--tls-key", files.key);
    if (!key.ok()) return key.status();
    auto certs = ParseCerts("--tls-cert", files.cert, *cert);
    if (!certs.ok()) return certs.status();
    Bio bio = MemBio(*key);
    ERR_clear_error();
    std::unique_ptr<EVP_PKEY, KeyFree> pkey(
        PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
    if (!pkey) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-key ", files.key,
                       " holds no readable private key (encrypted keys are not supported: "
                       "decrypt it with `openssl pkey`) (",
                       OpenSslError(), ")"));
    }
    if (X509_check_private_key(certs->front().get(), pkey.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-key ", files.key, " does not match the certificate of --tls-cert ",
                       files.cert, " (a key of another certificate)"));
    }
    m.cert_pem = std::move(*cert);
    m.key_pem = std::move(*key);
  }
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("--tls-ca", files.ca);
    if (!ca.ok()) return ca.status();
    auto certs = ParseCerts("--tls-ca", files.ca, *ca);
    if (!certs.ok()) return certs.status();
    m.ca_pem = std::move(*ca);
  }
  return m;
}

absl::Status CheckAuthToken(std::string_view token) {
  if (token.size() < 16 || token.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the auth token must be 16 to 4096 characters long, it has ", token.size()));
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          "the auth token must be printable ASCII without spaces (it goes into a gRPC header)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> LoadAuthToken(const std::string& path) {
  std::string token;
  std::string source;
  if (!path.empty()) {
    absl::StatusOr<std::string> text = ReadFileToString(path);
    if (!text.ok()) {
      return absl::Status(text.status().code(), absl::StrCat("--auth-token-file ", path, ": ",
                                                             text.status().message()));
    }
    token = std::string(absl::StripAsciiWhitespace(*text));
    source = absl::StrCat("--auth-token-file ", path);
  } else if (const char* env = std::getenv(kAuthTokenEnv); env != nullptr && *env != '\0') {
    token = std::string(absl::StripAsciiWhitespace(env));
    source = kAuthTokenEnv;
  } else {
    return absl::NotFoundError(
        absl::StrCat("no auth token: give --auth-token-file FILE or set ", kAuthTokenEnv));
  }
  if (absl::Status s = CheckAuthToken(token); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return token;
}

bool IsLoopbackAddress(std::string_view host_port) {
  if (absl::StartsWith(ToAbsl(host_port), "unix:")) return true;  // a local socket file
  std::string_view host = host_port;
  if (absl::StartsWith(ToAbsl(host), "[")) {  // [v6]:port
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {  // v4 or name, with a port
    host = host.substr(0, host.find(':'));
  }
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8 in dotted-quad form only.
  int parts = 0;
  for (std::string_view rest = host;; ++parts) {
    const size_t dot = rest.find('.');
    const std::string_view part = rest.substr(0, dot);
    int v = 0;
    if (part.empty() || part.size() > 3 || !absl::SimpleAtoi(ToAbsl(part), &v) || v > 255) {
      return false;
    }
    if (parts == 0 && v != 127) return false;
    if (dot == std::string_view::npos) break;
    rest = rest.substr(dot + 1);
  }
  return parts == 3;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const ServerSecurity& security) {
  if (security.insecure) return grpc::InsecureServerCredentials();
  // Client certificates are asked for and verified against ca when presented, not required:
  // job clients have none; auth_policy.h requires one for the task API.
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = security.tls.ca_pem;
  options.pem_key_cert_pairs.push_back({security.tls.key_pem, security.tls.cert_pem});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(options);
  creds->SetAuthMetadataProcessor(
      std::make_shared<CoordinatorAuthProcessor>(security.job_token));
  return creds;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const ClientSecurity& security) {
  if (security.insecure) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = security.tls.ca_pem;
  options.pem_private_key = security.tls.key_pem;
  options.pem_cert_chain = security.tls.cert_pem;
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(options);
  if (security.token.empty()) return creds;
  return grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(security.token));
}

}  // namespace adjsh
