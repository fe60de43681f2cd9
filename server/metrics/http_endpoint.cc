#include "server/metrics/http_endpoint.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpucompute {
namespace {

constexpr int kIoTimeoutSeconds = 5;
constexpr size_t kMaxRequestBytes = 16 * 1024;

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    sent += size_t(n);
  }
}

std::string Response(int code, const char* reason, const std::string& content_type,
                     const std::string& body, bool head_only) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  if (!head_only) out += body;
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& listen, std::function<std::string()> body) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: expected host:port but got \"", listen, "\""));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);

  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: cannot resolve \"", host, "\": ", gai_strerror(rc)));
  }
  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint());
  std::string last_error = "no address";
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
      endpoint->listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(result);
  if (endpoint->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", listen, " (--metrics_listen): ", last_error));
  }
  sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  getsockname(endpoint->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  endpoint->port_ = bound.ss_family == AF_INET6
                        ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                        : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(endpoint->wake_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("metrics: pipe: ", std::strerror(errno)));
  }
  endpoint->body_ = std::move(body);
  endpoint->thread_ = std::thread([e = endpoint.get()] { e->Loop(); });
  return endpoint;
}

HttpEndpoint::~HttpEndpoint() {
  if (thread_.joinable()) {
    char byte = 0;
    while (write(wake_[1], &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]})
    if (fd >= 0) close(fd);
}

void HttpEndpoint::Loop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    timeval tv{kIoTimeoutSeconds, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    Answer(fd);
    close(fd);
  }
}

void HttpEndpoint::Answer(int fd) {
  std::string request;
  char buf[2048];
  // One deadline for the whole request, so that a client trickling bytes
  // cannot hold the (only) serving thread.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kIoTimeoutSeconds);
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) return;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    request.append(buf, size_t(n));
    if (request.size() > kMaxRequestBytes) {
      SendAll(fd, Response(431, "Request Header Fields Too Large", "text/plain", "", false));
      return;
    }
  }
  const size_t line_end = request.find_first_of("\r\n");
  const std::string line = request.substr(0, line_end);
  const bool get = absl::StartsWith(line, "GET ");
  const bool head = absl::StartsWith(line, "HEAD ");
  if (!get && !head) {
    SendAll(fd, Response(405, "Method Not Allowed", "text/plain", "only GET\n", false));
    return;
  }
  const size_t path_begin = line.find(' ') + 1;
  const std::string path = line.substr(path_begin, line.find(' ', path_begin) - path_begin);
  const std::string bare = path.substr(0, path.find('?'));
  if (bare != "/metrics" && bare != "/") {
    SendAll(fd, Response(404, "Not Found", "text/plain", "see /metrics\n", head));
    return;
  }
  SendAll(fd, Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", body_(), head));
}

}  // namespace gpucompute
