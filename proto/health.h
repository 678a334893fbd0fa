// The gRPC health service (proto/health.proto) of a coordinator or a worker: on its main port
// (the coordinator's --listen, a worker's --peer-listen), under the same TLS, for the clients
// and load balancers that check the address they dial (proto/auth_policy.h lets any TLS caller
// ask), and on a plaintext server of its own (`--health-listen HOST:PORT`) for Kubernetes gRPC
// probes, which speak neither TLS nor tokens. The process sets its status: a coordinator
// SERVING once it serves, a worker once it has registered with its coordinator; both
// NOT_SERVING while they shut down.
#ifndef ADJSH_PROTO_HEALTH_H_
#define ADJSH_PROTO_HEALTH_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "proto/health.grpc.pb.h"

namespace adjsh {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  void SetServing(bool serving) { serving_.store(serving); }
  bool serving() const { return serving_.load(); }
  // Ends every Watch (the server is shutting down).
  void Stop() { stopped_.store(true); }

  // "" and "adjsh" are the process; any other service is NOT_FOUND.
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse*) override;
  // The status now, then each change, until the client goes or Stop.
  grpc::Status Watch(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>*) override;

 private:
  std::atomic<bool> serving_{false}, stopped_{false};
};

class HealthServer {
 public:
  // Serves HealthService, plaintext, on `listen` (HOST:PORT, port 0: a free one). NOT_SERVING
  // until SetServing(true). UNAVAILABLE when the address cannot be served.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& listen);
  ~HealthServer();
  void SetServing(bool serving) { service_.SetServing(serving); }
  const std::string& address() const { return address_; }  // HOST:PORT, the port chosen

 private:
  HealthServer() = default;
  HealthService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// One Check of HOST:PORT within `timeout_s`: SERVING, NOT_SERVING, or the error. Plaintext
// (a --health-listen port) unless `credentials` are given (a main port: TLS, the server's
// certificate checked for `server_name`, "": the host dialled).
absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
    const std::string& address, const std::string& service, double timeout_s,
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
    const std::string& server_name = "");

}  // namespace adjsh

#endif  // ADJSH_PROTO_HEALTH_H_
