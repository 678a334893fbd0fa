#include "proto/health.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "proto/status_util.h"
#include "proto/transport.h"

namespace adjsh {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

bool KnownService(const std::string& name) { return name.empty() || name == "adjsh"; }

}  // namespace

grpc::Status HealthService::Check(grpc::ServerContext*, const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  if (!KnownService(request->service())) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service");
  }
  response->set_status(serving() ? HealthCheckResponse::SERVING
                                 : HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* ctx, const HealthCheckRequest* request,
                                  grpc::ServerWriter<HealthCheckResponse>* writer) {
  int last = -1;
  while (!ctx->IsCancelled() && !stopped_.load()) {
    HealthCheckResponse r;
    r.set_status(!KnownService(request->service()) ? HealthCheckResponse::SERVICE_UNKNOWN
                 : serving()                       ? HealthCheckResponse::SERVING
                                                   : HealthCheckResponse::NOT_SERVING);
    if (r.status() != last) {
      if (!writer->Write(r)) break;
      last = r.status();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& listen) {
  std::unique_ptr<HealthServer> h(new HealthServer());
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  RefusePortInUse(builder);
  builder.RegisterService(&h->service_);
  h->server_ = builder.BuildAndStart();
  if (!h->server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve health checks on ", listen));
  }
  h->address_ = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  return h;
}

HealthServer::~HealthServer() {
  service_.SetServing(false);
  service_.Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

absl::StatusOr<HealthCheckResponse::ServingStatus> CheckHealth(
    const std::string& address, const std::string& service, double timeout_s,
    std::shared_ptr<grpc::ChannelCredentials> credentials, const std::string& server_name) {
  grpc::ChannelArguments args;
  if (!server_name.empty()) args.SetSslTargetNameOverride(server_name);
  auto channel = grpc::CreateCustomChannel(
      address, credentials ? credentials : grpc::InsecureChannelCredentials(), args);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status s = stub->Check(&ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s);
  return response.status();
}

}  // namespace adjsh
