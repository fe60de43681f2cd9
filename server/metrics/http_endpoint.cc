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
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpucompute {
namespace {

// Each connection has this long for the whole exchange (request and answer).
constexpr auto kConnectionDeadline = std::chrono::seconds(5);
constexpr size_t kMaxRequestBytes = 16 * 1024;
// Connections held at once; more wait in the listen backlog.
constexpr size_t kMaxConnections = 256;

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
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 64) == 0 &&
        fcntl(fd, F_SETFL, O_NONBLOCK) == 0) {
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

struct HttpEndpoint::Connection {
  int fd = -1;
  std::chrono::steady_clock::time_point deadline;
  std::string in;   // the request so far
  std::string out;  // the answer, once the request is whole
  size_t sent = 0;  // bytes of `out` sent
};

void HttpEndpoint::Loop() {
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    // Connections past their deadline are dropped, whatever they were doing.
    for (size_t i = 0; i < conns.size();) {
      if (now >= conns[i].deadline) {
        close(conns[i].fd);
        conns[i] = std::move(conns.back());
        conns.pop_back();
      } else {
        ++i;
      }
    }
    int timeout_ms = -1;
    for (const Connection& c : conns) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count() + 1;
      if (timeout_ms < 0 || left < timeout_ms) timeout_ms = int(left);
    }
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    // At the cap, new connections wait in the backlog until one closes.
    fds.push_back({conns.size() < kMaxConnections ? listen_fd_ : -1, POLLIN, 0});
    for (const Connection& c : conns)
      fds.push_back({c.fd, short(c.out.empty() ? POLLIN : POLLOUT), 0});
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents) break;
    // Serve the connections polled above (fds[2 + i] is conns[i]) before
    // taking new ones.
    for (size_t i = conns.size(); i-- > 0;) {
      const short ev = fds[2 + i].revents;
      if (ev == 0) continue;
      Connection& c = conns[i];
      bool keep = true;
      if (c.out.empty() && (ev & (POLLIN | POLLHUP | POLLERR))) keep = Read(&c);
      if (keep && !c.out.empty()) keep = Write(&c);
      if (!keep) {
        close(c.fd);
        conns[i] = std::move(conns.back());
        conns.pop_back();
      }
    }
    if (fds[1].revents & POLLIN) {
      while (conns.size() < kMaxConnections) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;  // EAGAIN: none left (or a transient error)
        Connection c;
        c.fd = fd;
        c.deadline = std::chrono::steady_clock::now() + kConnectionDeadline;
        conns.push_back(std::move(c));
      }
    }
  }
  for (const Connection& c : conns) close(c.fd);
}

bool HttpEndpoint::Read(Connection* c) {
  char buf[4096];
  while (true) {
    const ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;  // more later
    if (n <= 0) {
      // The peer closed (or failed) before a whole request: answer what came,
      // as before, when there is a request line; else drop it.
      if (c->in.empty()) return false;
      c->out = Answer(c->in);
      return true;
    }
    c->in.append(buf, size_t(n));
    if (c->in.size() > kMaxRequestBytes) {
      c->out = Response(431, "Request Header Fields Too Large", "text/plain", "", false);
      return true;
    }
    if (c->in.find("\r\n\r\n") != std::string::npos || c->in.find("\n\n") != std::string::npos) {
      c->out = Answer(c->in);
      return true;
    }
  }
}

bool HttpEndpoint::Write(Connection* c) {
  while (c->sent < c->out.size()) {
    const ssize_t n = send(c->fd, c->out.data() + c->sent, c->out.size() - c->sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;  // when writable again
    if (n <= 0) return false;
    c->sent += size_t(n);
  }
  return false;  // all sent: close
}

std::string HttpEndpoint::Answer(const std::string& request) {
  const size_t line_end = request.find_first_of("\r\n");
  const std::string line = request.substr(0, line_end);
  const bool get = absl::StartsWith(line, "GET ");
  const bool head = absl::StartsWith(line, "HEAD ");
  if (!get && !head) return Response(405, "Method Not Allowed", "text/plain", "only GET\n", false);
  const size_t path_begin = line.find(' ') + 1;
  const std::string path = line.substr(path_begin, line.find(' ', path_begin) - path_begin);
  const std::string bare = path.substr(0, path.find('?'));
  if (bare != "/metrics" && bare != "/")
    return Response(404, "Not Found", "text/plain", "see /metrics\n", head);
  return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", body_(), head);
}

}  // namespace gpucompute
