#include "common/metrics_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/address.h"
#include "common/build_info.h"
#include "prometheus/text_serializer.h"

namespace adjsh::metrics {
namespace {

prometheus::MetricType TypeOf(Kind kind) {
  switch (kind) {
    case Kind::kCounter:
      return prometheus::MetricType::Counter;
    case Kind::kGauge:
      return prometheus::MetricType::Gauge;
    case Kind::kHistogram:
      return prometheus::MetricType::Histogram;
  }
  return prometheus::MetricType::Untyped;
}

std::vector<prometheus::ClientMetric::Label> ToLabels(const Labels& labels) {
  std::vector<prometheus::ClientMetric::Label> out;
  for (const auto& [name, value] : labels) out.push_back({name, value});
  return out;
}

// The first line of `path` as a byte count; 0 when absent, unreadable or "max" (no limit).
uint64_t ReadLimit(const char* path) {
  std::ifstream in(path);
  std::string line;
  uint64_t v = 0;
  if (!std::getline(in, line) || !absl::SimpleAtoi(line, &v)) return 0;
  return v;
}

}  // namespace

prometheus::MetricFamily Family(const MetricDef& def) {
  prometheus::MetricFamily f;
  f.name = std::string(def.name);
  f.help = std::string(def.help);
  f.type = TypeOf(def.kind);
  return f;
}

void AddSample(prometheus::MetricFamily& family, double value, const Labels& labels) {
  prometheus::ClientMetric m;
  m.label = ToLabels(labels);
  if (family.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family.metric.push_back(std::move(m));
}

void AddHistogram(prometheus::MetricFamily& family, const prometheus::Histogram& histogram,
                  const Labels& labels) {
  prometheus::ClientMetric m = histogram.Collect();
  m.label = ToLabels(labels);
  family.metric.push_back(std::move(m));
}

prometheus::Histogram::BucketBoundaries ExponentialBuckets(double first, double factor,
                                                           int count) {
  prometheus::Histogram::BucketBoundaries b;
  double v = first;
  for (int k = 0; k < count; ++k, v *= factor) b.push_back(v);
  return b;
}

uint64_t MemoryLimitBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  uint64_t limit = pages > 0 && page > 0
                       ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                       : std::numeric_limits<uint64_t>::max();
  // cgroup v1 reports "no limit" as a huge number; the min() takes care of it.
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t v = ReadLimit(path);
    if (v > 0 && v < limit) limit = v;
  }
  return limit;
}

std::string Exposition(
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : collectables) {
    std::vector<prometheus::MetricFamily> f = c->Collect();
    families.insert(families.end(), std::make_move_iterator(f.begin()),
                    std::make_move_iterator(f.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen) {
  if (absl::Status s = CheckHostPort("metrics-listen", listen); !s.ok()) return s;
  const size_t colon = listen.rfind(':');
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:9100
  }
  const auto unavailable = [&](const std::string& why) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", why));
  };
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return unavailable(gai_strerror(rc));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && server->listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
      server->listen_fd_ = fd;
    } else {
      error = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (server->listen_fd_ < 0) return unavailable(error);
  sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = ntohs(bound.ss_family == AF_INET6
                                   ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                   : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  server->address_ = absl::StrCat(listen.substr(0, colon), ":", bound_port);
  server->thread_ = std::thread([raw = server.get()] { raw->Serve(); });
  return server;
}

MetricsServer::~MetricsServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void MetricsServer::Add(std::shared_ptr<prometheus::Collectable> collectable) {
  std::lock_guard<std::mutex> lock(mu_);
  collectables_.push_back(std::move(collectable));
}

void MetricsServer::Serve() {
  while (!stop_.load()) {
    pollfd p = {.fd = listen_fd_, .events = POLLIN, .revents = 0};
    if (poll(&p, 1, 100) <= 0) continue;  // timeout (check stop_) or EINTR
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Answer(fd);
    close(fd);
  }
}

void MetricsServer::Answer(int fd) {
  const timeval timeout = {.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  // The request head: up to the blank line, at most 16 KiB (the body, if any, is not read).
  std::string request;
  char buf[4096];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;  // closed, timed out or failed: nothing to answer
    request.append(buf, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find("\r\n"));
  const std::vector<std::string> parts = absl::StrSplit(line, ' ');
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (parts.size() != 3 || parts[2].rfind("HTTP/", 0) != 0) {
    status = "400 Bad Request", type = "text/plain", body = "bad request\n";
  } else if (parts[0] != "GET" && parts[0] != "HEAD") {
    status = "405 Method Not Allowed", type = "text/plain", body = "GET /metrics\n";
  } else if (const std::string path = parts[1].substr(0, parts[1].find('?')); path == "/metrics") {
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables;
    {
      std::lock_guard<std::mutex> lock(mu_);
      collectables = collectables_;
    }
    body = Exposition(collectables);
  } else if (path == "/") {
    type = "text/plain", body = "adjsh metrics: GET /metrics\n";
  } else {
    status = "404 Not Found", type = "text/plain", body = "not found; GET /metrics\n";
  }
  std::string answer = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                                    "\r\nContent-Length: ", body.size(),
                                    "\r\nConnection: close\r\n\r\n");
  if (parts.empty() || parts[0] != "HEAD") answer += body;
  for (size_t sent = 0; sent < answer.size();) {
    const ssize_t n = send(fd, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

Labels BuildInfoLabels(const std::string& component) {
  return {{"component", component},
          {"version", kAdjshVersion},
          {"revision", kAdjshRevision},
          {"cuda", kAdjshCuda ? "true" : "false"}};
}

}  // namespace adjsh::metrics
