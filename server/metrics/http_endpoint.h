// A minimal HTTP/1.x endpoint that answers GET /metrics with a text body.
//
// It replaces prometheus-cpp's Exposer: Debian's civetweb starts its threads
// with a small fixed stack, which the static TLS of the CUDA runtime (and of
// OpenBLAS) leaves too small, so its workers die and scrapes get an empty
// reply. One thread of ours with a normal stack serves every connection at
// once: non-blocking sockets under poll(), each connection with its own
// deadline for the whole exchange, so that idle or trickling clients delay
// nobody else's scrape (they are closed when their deadline passes).
#ifndef GPUCOMPUTE_SERVER_METRICS_HTTP_ENDPOINT_H_
#define GPUCOMPUTE_SERVER_METRICS_HTTP_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace gpucompute {

class HttpEndpoint {
 public:
  // Listens on `listen` ("host:port", "[v6]:port"; port 0 picks a free one)
  // and answers GET /metrics (and GET /) with `body()` as
  // text/plain; version=0.0.4. Other paths get 404, other methods 405.
  // Errors: INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& listen,
                                                             std::function<std::string()> body);
  // Stops accepting, closes the open connections, joins the thread.
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const { return port_; }

 private:
  struct Connection;

  HttpEndpoint() = default;
  void Loop();
  // Reads what `c` has sent; once the request is whole, puts the answer in
  // c->out. False when the connection is to be closed.
  bool Read(Connection* c);
  // Sends what is left of c->out. False when the connection is to be closed
  // (all sent, or the peer is gone).
  bool Write(Connection* c);
  // The response to a whole request.
  std::string Answer(const std::string& request);

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe; a byte written to wake_[1] stops Loop
  int port_ = 0;
  std::function<std::string()> body_;
  std::thread thread_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_METRICS_HTTP_ENDPOINT_H_
