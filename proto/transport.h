// Connection settings every adjsh gRPC endpoint shares: message size limits and keepalive.
//
// Keepalive: both ends ping an idle connection every kKeepaliveTimeMs and drop it when the ping
// is not answered within kKeepaliveTimeoutMs, so a vanished peer (host down, cable cut, a
// half-open NAT entry) is noticed while a long WatchJob stream or a worker's next pull waits on
// it. The server accepts pings that often, also on connections without calls (gRPC's default
// would answer them with GOAWAY "too_many_pings").
#ifndef ADJSH_PROTO_TRANSPORT_H_
#define ADJSH_PROTO_TRANSPORT_H_

#include <cstdint>

#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"

namespace adjsh {

// How long one connection attempt, TCP connect and TLS handshake together, may take. gRPC
// takes it from GRPC_ARG_MIN_RECONNECT_BACKOFF_MS (the backoff between attempts is
// GRPC_ARG_INITIAL/MAX_RECONNECT_BACKOFF_MS); a small value makes TLS handshakes on a loaded
// machine time out ("Handshake write failed") over and over.
inline constexpr int kConnectTimeoutMs = 20000;
inline constexpr int kKeepaliveTimeMs = 20000;
inline constexpr int kKeepaliveTimeoutMs = 10000;
// Largest message a coordinator accepts by default: tensors travel in 1 MiB pieces
// (tensor_codec.h), so this bounds a peer's single allocation, not a tensor.
inline constexpr int kDefaultMaxMessageBytes = 8 << 20;

// Message limits (both directions) and keepalive for a server.
void ConfigureServer(grpc::ServerBuilder& builder, int max_message_bytes);
// gRPC binds with SO_REUSEPORT by default on Linux: a second adjsh server given a port one
// already listens on shared it, silently (two coordinators then answered one address in turn,
// handing out the same job ids). With this a port in use fails the server's start. Part of
// ConfigureServer; alone for servers that take none of its other settings (health checks).
void RefusePortInUse(grpc::ServerBuilder& builder);

// Channel arguments of a client: keepalive, the connect timeout and the largest message it
// accepts.
grpc::ChannelArguments ClientChannelArgs(int max_message_bytes = kDefaultMaxMessageBytes);

}  // namespace adjsh

#endif  // ADJSH_PROTO_TRANSPORT_H_
