// The gpucompute C++ client: one class with a method per RPC of
// gpucompute.v1.Compute, plus the grpc.health.v1 check. Tensors travel as the
// proto's Tensor (dtype + shape + row-major little-endian bytes); the helpers
// below build and read them from host buffers.
//
//   auto client = gpucompute::Client::Create({.target = "localhost:50051"});
//   gpucompute::v1::GemmRequest req;
//   *req.mutable_a() = gpucompute::MakeTensor(gpucompute::v1::FLOAT32, {m, k}, a_bytes);
//   *req.mutable_b() = gpucompute::MakeTensor(gpucompute::v1::FLOAT32, {k, n}, b_bytes);
//   absl::StatusOr<gpucompute::v1::GemmResponse> c =
//       (*client)->Gemm(req, {.timeout = absl::Seconds(5)});
#ifndef GPUCOMPUTE_CLIENT_CLIENT_H_
#define GPUCOMPUTE_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpucompute/v1/compute.grpc.pb.h"
#include "gpucompute/v1/compute.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"

namespace gpucompute {

// How the client reaches the server. (Every member has an initializer, so
// designated initializers such as {.target = "host:port"} leave the rest at
// their defaults.)
struct ClientOptions {
  // host:port, or any gRPC target URI (dns:///svc:50051 for a headless
  // Kubernetes Service together with lb_policy = "round_robin").
  std::string target = "localhost:50051";
  // Deadline of a call whose CallOptions give none.
  absl::Duration default_timeout = absl::Seconds(60);
  // Largest message sent or received; the server's default is the same 1 GiB.
  int64_t max_message_bytes = int64_t{1} << 30;
  // gRPC load-balancing policy ("pick_first" when empty).
  std::string lb_policy{};
  // Use TLS. The paths below are PEM files; empty ones are not used
  // (root_certs_path empty: the system's roots; client cert and key: only for
  // mutual TLS, both or neither).
  bool use_tls = false;
  std::string root_certs_path{};
  std::string client_cert_path{};
  std::string client_key_path{};
  // Name checked against the server certificate instead of the target's host.
  std::string tls_server_name{};
  // Open a connection of this client's own instead of sharing one with other
  // clients of the same target in this process.
  bool own_connection = false;
};

// Per-call settings.
struct CallOptions {
  // Deadline measured from the start of the call; zero means the client's
  // default_timeout, absl::InfiniteDuration() none at all.
  absl::Duration timeout = absl::ZeroDuration();
  // Wait for the channel to become ready instead of failing fast while the
  // server is unreachable (still bounded by the deadline).
  bool wait_for_ready = false;
};

// One answered item of a batch stream.
struct BatchItem {
  v1::BatchResponse response;
  // Seconds from writing the request to reading its response.
  double latency_seconds = 0;
};

// grpc.health.v1 serving states.
using ServingStatus = ::grpc::health::v1::HealthCheckResponse::ServingStatus;

// A connection to one gpucompute server. Thread-safe: every method may be
// called from many threads at once. Errors are the server's gRPC status
// carried over as absl::Status with the same code and message
// (DEADLINE_EXCEEDED when the deadline passes, UNAVAILABLE when the server
// cannot be reached).
class Client {
 public:
  // Builds the channel (it connects lazily, on the first call). Errors:
  // INVALID_ARGUMENT for inconsistent options, NOT_FOUND when a TLS file
  // cannot be read.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  absl::StatusOr<v1::GemmResponse> Gemm(const v1::GemmRequest& request,
                                        const CallOptions& call = {}) const;
  absl::StatusOr<v1::GemvResponse> Gemv(const v1::GemvRequest& request,
                                        const CallOptions& call = {}) const;
  absl::StatusOr<v1::ReduceResponse> Reduce(const v1::ReduceRequest& request,
                                            const CallOptions& call = {}) const;
  absl::StatusOr<v1::TransposeResponse> Transpose(const v1::TransposeRequest& request,
                                                  const CallOptions& call = {}) const;
  absl::StatusOr<v1::AttentionResponse> Attention(const v1::AttentionRequest& request,
                                                  const CallOptions& call = {}) const;
  absl::StatusOr<v1::EchoResponse> Echo(const v1::EchoRequest& request,
                                        const CallOptions& call = {}) const;
  absl::StatusOr<v1::ServerInfoResponse> GetServerInfo(const CallOptions& call = {}) const;

  // Streams `count` requests over one Batch call and collects the answers.
  // request_at(i) returns request i; the reference must stay valid until the
  // next call of request_at (one request is written at a time, so a caller may
  // reuse one message). Ids must be unique. At most `max_outstanding` requests
  // are unanswered at any time (0: no limit). The deadline covers the whole
  // stream. Returns the answers in request order, failed items included
  // (their code != 0). Errors: the stream's status when the stream itself
  // fails; INTERNAL when the server answers an unknown or repeated id or
  // leaves one unanswered; INVALID_ARGUMENT for a repeated request id.
  absl::StatusOr<std::vector<BatchItem>> Batch(
      int64_t count, const std::function<const v1::BatchRequest&(int64_t)>& request_at,
      const CallOptions& call = {}, int max_outstanding = 0) const;
  // The same over a vector of requests.
  absl::StatusOr<std::vector<BatchItem>> Batch(const std::vector<v1::BatchRequest>& requests,
                                               const CallOptions& call = {},
                                               int max_outstanding = 0) const;

  // grpc.health.v1 Check of `service` ("" = the whole server;
  // "gpucompute.v1.Compute" = the compute service).
  absl::StatusOr<ServingStatus> Health(const std::string& service = "",
                                       const CallOptions& call = {}) const;

  const ClientOptions& options() const { return options_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Compute::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
};

// Tensor helpers.

// Bytes per element of `dtype`; 0 for DTYPE_UNSPECIFIED.
int64_t ElementSize(v1::DType dtype);

// "float32", "float16", "bfloat16" or "unspecified".
std::string DTypeName(v1::DType dtype);

// Parses "float32"/"f32"/"fp32", "float16"/"f16"/"fp16"/"half",
// "bfloat16"/"bf16". INVALID_ARGUMENT otherwise.
absl::StatusOr<v1::DType> ParseDType(const std::string& name);

// Product of the dimensions (1 for a scalar). INVALID_ARGUMENT for a negative
// dimension or a product that overflows int64.
absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape);

// A tensor of `dtype` and `shape` holding `data` (moved in).
// REQUIRES: data.size() == product(shape) * ElementSize(dtype).
v1::Tensor MakeTensor(v1::DType dtype, const std::vector<int64_t>& shape, std::string data);

// A float32 tensor holding `values`. REQUIRES: values.size() == product(shape).
v1::Tensor MakeFloat32Tensor(const std::vector<int64_t>& shape, const std::vector<float>& values);

// The tensor's shape as a vector.
std::vector<int64_t> ShapeOf(const v1::Tensor& tensor);

// "[2,3,4]".
std::string ShapeString(const std::vector<int64_t>& shape);

// OK when the dtype is set and the byte length matches the shape; otherwise
// INVALID_ARGUMENT naming `name`.
absl::Status CheckTensor(const v1::Tensor& tensor, const std::string& name);

// Bytes of the tensor's data (the payload; shape and dtype not counted).
int64_t PayloadBytes(const v1::Tensor& tensor);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_CLIENT_H_
