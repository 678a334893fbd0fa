#include "cli/security_flags.h"

#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "proto/transport.h"

namespace adjsh::cli {
namespace {

absl::Status Usage(SecurityError* error, absl::Status s) {
  error->usage = true;
  error->status = s;
  return s;
}

absl::Status Input(SecurityError* error, absl::Status s) {
  error->usage = false;
  error->status = s;
  return s;
}

}  // namespace

void AddServerSecurityFlags(ArgParser& a) {
  a.Add("tls-cert", "FILE", "PEM certificate (chain) of this coordinator, for TLS");
  a.Add("tls-key", "FILE", "PEM private key of --tls-cert");
  a.Add("tls-ca", "FILE",
        "PEM CA certificate(s) that sign the workers' client certificates (mutual TLS)");
  a.Add("auth-token-file", "FILE",
        "bearer token the job API requires (16+ printable characters; default: the "
        "ADJSH_AUTH_TOKEN environment variable)");
  a.AddBool("insecure-local",
            "serve plaintext gRPC without any authentication; only for a loopback --listen "
            "address (127.0.0.0/8, ::1, localhost)");
}

absl::StatusOr<ServerSecurity> ServerSecurityFromFlags(const ArgParser& a,
                                                       const std::string& listen,
                                                       SecurityError* error) {
  ServerSecurity sec;
  const bool any_tls = a.Has("tls-cert") || a.Has("tls-key") || a.Has("tls-ca");
  if (a.GetBool("insecure-local")) {
    if (any_tls || a.Has("auth-token-file")) {
      return Usage(error, absl::InvalidArgumentError(
                              "--insecure-local excludes --tls-cert, --tls-key, --tls-ca and "
                              "--auth-token-file"));
    }
    if (!IsLoopbackAddress(listen)) {
      return Usage(error, absl::InvalidArgumentError(absl::StrCat(
                              "--insecure-local serves loopback addresses only (127.0.0.0/8, "
                              "::1, localhost); --listen ",
                              listen, " is not one: use TLS (--tls-cert, --tls-key, --tls-ca)")));
    }
    sec.insecure = true;
    return sec;
  }
  if (!a.Has("tls-cert") || !a.Has("tls-key") || !a.Has("tls-ca")) {
    return Usage(error, absl::InvalidArgumentError(
                            "the coordinator needs --tls-cert, --tls-key and --tls-ca (mutual "
                            "TLS with the workers) and a job token (--auth-token-file or "
                            "ADJSH_AUTH_TOKEN), or --insecure-local for a loopback-only "
                            "coordinator without TLS and authentication"));
  }
  absl::StatusOr<TlsMaterial> tls =
      LoadTlsFiles({a.Get("tls-cert"), a.Get("tls-key"), a.Get("tls-ca")});
  if (!tls.ok()) return Input(error, tls.status());
  sec.tls = std::move(*tls);
  absl::StatusOr<std::string> token =
      LoadAuthToken(a.Has("auth-token-file") ? a.Get("auth-token-file") : "");
  if (!token.ok()) {
    if (absl::IsNotFound(token.status()) && !a.Has("auth-token-file")) {
      return Usage(error, absl::InvalidArgumentError(absl::StrCat(
                              "the job API needs a token: ", token.status().message())));
    }
    return Input(error, token.status());
  }
  sec.job_token = std::move(*token);
  return sec;
}

void AddClientSecurityFlags(ArgParser& a, bool worker) {
  a.Add("tls-ca", "FILE",
        "PEM CA certificate that signs the coordinator's certificate: connect with TLS "
        "(without it: plaintext, to a loopback coordinator started with --insecure-local)");
  a.Add("tls-cert", "FILE",
        worker ? "PEM client certificate of this worker, signed by the coordinator's --tls-ca "
                 "(required with --tls-ca)"
               : "PEM client certificate to present (not needed for the job API)");
  a.Add("tls-key", "FILE", "PEM private key of --tls-cert");
  a.Add("tls-server-name", "NAME",
        "with --tls-ca: the name the coordinator's certificate must carry, checked instead of "
        "--coordinator's host (e.g. adjsh-coordinator through kubectl port-forward)");
  if (!worker) {
    a.Add("auth-token-file", "FILE",
          "bearer token of the coordinator's job API, sent over TLS only (default: the "
          "ADJSH_AUTH_TOKEN environment variable)");
  }
}

absl::StatusOr<ClientSecurity> ClientSecurityFromFlags(const ArgParser& a,
                                                       const std::string& coordinator,
                                                       bool worker, SecurityError* error) {
  ClientSecurity sec;
  if (!a.Has("tls-ca")) {
    if (a.Has("tls-cert") || a.Has("tls-key") || a.Has("tls-server-name") ||
        (!worker && a.Has("auth-token-file"))) {
      return Usage(error, absl::InvalidArgumentError(
                              "--tls-cert, --tls-key, --tls-server-name and --auth-token-file "
                              "need --tls-ca (the coordinator's CA): certificates and tokens go "
                              "over TLS only"));
    }
    if (!IsLoopbackAddress(coordinator)) {
      return Usage(error, absl::InvalidArgumentError(absl::StrCat(
                              "--coordinator ", coordinator,
                              " is not a loopback address: connect with TLS (--tls-ca",
                              worker ? ", --tls-cert, --tls-key" : "", ")")));
    }
    sec.insecure = true;
    return sec;
  }
  if (worker && (!a.Has("tls-cert") || !a.Has("tls-key"))) {
    return Usage(error, absl::InvalidArgumentError(
                            "a worker authenticates with its client certificate: --tls-ca "
                            "needs --tls-cert and --tls-key"));
  }
  absl::StatusOr<TlsMaterial> tls = LoadTlsFiles(
      {a.Has("tls-cert") ? a.Get("tls-cert") : "", a.Has("tls-key") ? a.Get("tls-key") : "",
       a.Get("tls-ca")});
  if (!tls.ok()) return Input(error, tls.status());
  sec.tls = std::move(*tls);
  if (a.Has("tls-server-name")) {
    if (a.Get("tls-server-name").empty()) {
      return Usage(error, absl::InvalidArgumentError("--tls-server-name is empty"));
    }
    sec.server_name = a.Get("tls-server-name");
  }
  if (!worker) {
    absl::StatusOr<std::string> token =
        LoadAuthToken(a.Has("auth-token-file") ? a.Get("auth-token-file") : "");
    if (token.ok()) {
      sec.token = std::move(*token);
    } else if (!absl::IsNotFound(token.status()) || a.Has("auth-token-file")) {
      return Input(error, token.status());
    }
    // No token at all: calls go without one, and the coordinator answers UNAUTHENTICATED.
  }
  return sec;
}

void AddLimitFlags(ArgParser& a) {
  const coordinator::JobLimits defaults;
  a.Add("max-context", "T", "most tokens per step of a job (context_length x batch_size)",
        std::to_string(defaults.max_context));
  a.Add("max-layers", "K", "most layers of a job's model", std::to_string(defaults.max_layers));
  a.Add("max-hidden", "D", "largest hidden size of a job's model",
        std::to_string(defaults.max_hidden));
  a.Add("max-tensor-bytes", "BYTES", "largest parameter tensor of a job's model, in f32 bytes",
        std::to_string(defaults.max_tensor_bytes));
  a.Add("max-model-bytes", "BYTES", "largest model of a job: all its parameters, in f32 bytes",
        std::to_string(defaults.max_model_bytes));
  a.Add("max-data-bytes", "BYTES",
        "largest training data of a job: its token file, or its text files together",
        std::to_string(defaults.max_data_bytes));
  a.Add("max-message-bytes", "BYTES",
        "largest gRPC message received or sent (at least 2 MiB: tensors travel in 1 MiB pieces)",
        std::to_string(kDefaultMaxMessageBytes));
}

absl::StatusOr<CoordinatorLimits> LimitsFromFlags(const ArgParser& a) {
  CoordinatorLimits l;
  for (auto [flag, field, max] :
       {std::tuple{"max-context", &l.job.max_context, int64_t{1} << 40},
        std::tuple{"max-layers", &l.job.max_layers, int64_t{1} << 31},
        std::tuple{"max-hidden", &l.job.max_hidden, int64_t{1} << 31}}) {
    absl::StatusOr<int64_t> v = a.GetInt(flag, 1, max);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  for (auto [flag, field] : {std::pair{"max-tensor-bytes", &l.job.max_tensor_bytes},
                             std::pair{"max-model-bytes", &l.job.max_model_bytes},
                             std::pair{"max-data-bytes", &l.job.max_data_bytes}}) {
    absl::StatusOr<int64_t> v = a.GetInt(flag, 1, int64_t{1} << 50);
    if (!v.ok()) return v.status();
    *field = static_cast<uint64_t>(*v);
  }
  absl::StatusOr<int64_t> message_bytes =
      a.GetInt("max-message-bytes", int64_t{2} << 20, int64_t{1} << 30);
  if (!message_bytes.ok()) return message_bytes.status();
  l.max_message_bytes = static_cast<int>(*message_bytes);
  return l;
}

int SecurityFail(const std::string& command, const SecurityError& error) {
  return error.usage ? BadUsage(command, error.status) : Fail(command, error.status);
}

}  // namespace adjsh::cli
