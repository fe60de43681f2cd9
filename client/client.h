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
//
// Resident tensors stay on the server between calls: Upload puts one there
// and answers its handle, an operand names it with HandleTensor(handle),
// OpOptions.keep_output keeps a result there, Download brings one back and
// Free releases it.
//
//   auto a = (*client)->Upload(gpucompute::v1::FLOAT32, {m, k}, a_ptr);
//   *req.mutable_a() = gpucompute::HandleTensor(a->handle());
//   req.mutable_options()->set_keep_output(true);
//   auto c = (*client)->Gemm(req);                       // c->c().handle()
//   (*client)->Download(c->c().handle(), c_ptr, m * n * 4);
//   (*client)->Free({a->handle(), c->c().handle()});
#ifndef GPUCOMPUTE_CLIENT_CLIENT_H_
#define GPUCOMPUTE_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpucompute/v1/compute.grpc.pb.h"
#include "gpucompute/v1/compute.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace gpucompute {

// How the client reaches the server. (Every member has an initializer, so
// designated initializers such as {.target = "host:port"} leave the rest at
// their defaults.)
struct ClientOptions {
  // host:port; several replicas as a list of IP addresses
  // "10.0.0.1:50051,10.0.0.2:50051" (all IPv4, or all [IPv6]; localhost
  // counts as 127.0.0.1); or any gRPC target URI (dns:///svc:50051 for a
  // headless Kubernetes Service together with lb_policy = "round_robin").
  std::string target = "localhost:50051";
  // Deadline of a call whose CallOptions give none.
  absl::Duration default_timeout = absl::Seconds(60);
  // Largest message sent or received; the server's default is the same 1 GiB.
  int64_t max_message_bytes = int64_t{1} << 30;
  // gRPC load-balancing policy: "round_robin" (each call to the next ready
  // replica) or "pick_first" (every call to one). Empty: round_robin for a
  // list of addresses, pick_first otherwise. Resident tensors live on one
  // replica: over several, use pick_first or one client per replica.
  std::string lb_policy{};
  // Attempts of an idempotent call (the operations, Echo, GetServerInfo,
  // ListTensors, Download and health checks) that fails before any answer
  // UNAVAILABLE (a replica that died, is draining or cannot be reached) or
  // CANCELLED by the server (a replica shutting down cancels calls that
  // reach it as it stops): each retry goes through the load-balancing policy
  // again, to another replica under round_robin, after 50 ms doubling up to
  // 1 s. A call the client itself cancels is not retried. gRPC caps it at 5;
  // 1 disables retries. Requests larger than retry_buffer_bytes are sent
  // once. Upload, Free and Batch are never retried (not idempotent). An
  // operation with keep_output that is retried after its first attempt
  // reached a replica may leave a result there that its lease frees.
  int max_attempts = 4;
  int64_t retry_buffer_bytes = int64_t{64} << 20;
  // A call made while its connection is not up (the first call, or one after
  // the server went away) waits up to this long, and at most half its own
  // timeout, for a connection before it is sent; one that still has none then
  // fails at once with UNAVAILABLE. A failed connection attempt is repeated
  // after 100 ms, growing to 5 s. Zero: calls fail at once while gRPC backs
  // off after a failed attempt, even when the server is up again. Calls with
  // CallOptions::wait_for_ready wait for their deadline instead.
  absl::Duration connect_timeout = absl::Seconds(1);
  // HTTP/2 keepalive pings while calls are open, so that a replica that
  // vanished without closing its connections (a node lost) is noticed within
  // keepalive_time + keepalive_timeout; the server accepts pings every 10 s.
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // Use TLS. The paths below are PEM files; empty ones are not used
  // (root_certs_path empty: the system's roots; client cert and key: only for
  // mutual TLS, both or neither).
  bool use_tls = false;
  std::string root_certs_path{};
  std::string client_cert_path{};
  std::string client_key_path{};
  // Name checked against the server certificate instead of the target's host.
  std::string tls_server_name{};
  // Bearer token sent as "authorization: Bearer <token>" metadata of every
  // call (printable ASCII, no spaces), for a server started with
  // --token_file; or a file holding it (read once, by Create; surrounding
  // whitespace is ignored). One or neither. Servers accept tokens over TLS
  // only.
  std::string token{};
  std::string token_file{};
  // Open a connection of this client's own instead of sharing one with other
  // clients of the same target in this process.
  bool own_connection = false;

  // Owner of the resident tensors this client makes: sent as the
  // "gpucompute-session" metadata of every call when not empty (printable
  // ASCII). The server answers NOT_FOUND for another session's handles; calls
  // without a session share one anonymous owner.
  std::string session{};
  // Streams of a parallel Upload or Download, each on a TCP connection of its
  // own. Over loopback one connection carries about 5 GB/s of gRPC and eight
  // about 16 GB/s (measured on the GPU host): more connections help, well
  // below linearly, and each stream costs a thread on the client and on the
  // server; 4 sits between the two measured points (it was not measured on
  // its own). 1 sends every transfer over one stream.
  int streams = 4;
  // Bytes of tensor data per message of an upload or download stream; cut
  // down to max_message_bytes less 1 KiB for the message's other fields.
  int64_t chunk_bytes = int64_t{4} << 20;
  // Transfers smaller than this use one stream whatever `streams` says: the
  // extra streams' connections and threads pay off only for large transfers
  // (64 MiB takes about 13 ms over one loopback connection at 5 GB/s).
  int64_t parallel_min_bytes = int64_t{64} << 20;
  // An operation (Gemm, Gemv, Reduce, Transpose, Attention) whose inline
  // operands hold at least this many bytes is sent as resident tensors: the
  // operands are uploaded over parallel streams, the operation runs on their
  // handles keeping its result, the result is downloaded over parallel
  // streams and every handle is freed; the caller sees the same request and
  // response. One unary message moves about 2.5 GB/s over loopback, parallel
  // streams about 11 GB/s. Where the upload is refused (an older server, a
  // full quota) the call goes as one message. 0: always one message. Never
  // with round_robin over several servers (resident tensors stay on the
  // server that holds them).
  int64_t offload_min_bytes = int64_t{64} << 20;
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

// The metadata key that carries ClientOptions::session.
inline constexpr char kSessionMetadataKey[] = "gpucompute-session";
// The metadata key that carries ClientOptions::token ("Bearer <token>").
inline constexpr char kAuthorizationMetadataKey[] = "authorization";
// Sent with every unary call: the request message's size in bytes, so that
// the server admits the call before receiving the request, or refuses it
// before it is sent if it can never fit.
inline constexpr char kRequestBytesMetadataKey[] = "gpucompute-request-bytes";

// Per-upload settings.
struct UploadOptions {
  // Device to hold the tensor; unset: the server picks the one with the most
  // room.
  std::optional<int32_t> device{};
  // Override ClientOptions::streams (at most 64) and chunk_bytes when > 0.
  int streams = 0;
  int64_t chunk_bytes = 0;
};

// Per-download settings.
struct DownloadOptions {
  // Override ClientOptions::streams (at most 64) and chunk_bytes when > 0.
  int streams = 0;
  int64_t chunk_bytes = 0;
};

// Writes the tensor bytes [offset, offset + size) to `dst`, for UploadFrom.
// A parallel upload calls it from one thread per stream at once, for
// disjoint ranges. A non-OK status stops the upload, which then returns it.
using UploadSource = std::function<absl::Status(int64_t offset, int64_t size, char* dst)>;

// Takes the tensor bytes [offset, offset + size) from `data` (valid only
// during the call), for DownloadTo. The bytes come in pieces of any size (as
// they arrived: a piece may end inside an element). A parallel download
// calls it from one thread per stream at once, for disjoint ranges, each
// range in increasing offsets. A non-OK status stops the download, which
// then returns it.
using DownloadSink = std::function<absl::Status(int64_t offset, const char* data, int64_t size)>;

// The gRPC target of ClientOptions::target: a list of addresses becomes an
// "ipv4:" or "ipv6:" URI ("127.0.0.1:1,127.0.0.1:2" ->
// "ipv4:127.0.0.1:1,127.0.0.1:2"); anything else is returned as it is.
// Errors: INVALID_ARGUMENT for a list holding a host name, an address
// without a port, or both IPv4 and IPv6 addresses.
absl::StatusOr<std::string> ChannelTarget(const std::string& target);

// The service config of a client with ClientOptions::max_attempts: a retry
// policy on UNAVAILABLE and CANCELLED for the idempotent methods ("{}" when
// max_attempts <= 1).
std::string RetryServiceConfig(int max_attempts);

// One contiguous byte range [begin, end) of a tensor.
struct ByteRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const ByteRange&) const = default;
};

// Where the parts of a parallel transfer begin: a multiple of this, which is
// a multiple of every element size, so that no element straddles two
// streams and each stream covers whole pages of the tensor.
inline constexpr int64_t kTransferAlignment = 4096;

// How a transfer of `bytes` is cut into the parts of its streams. One range
// [0, bytes) when streams <= 1 or bytes < parallel_min_bytes (a 0-byte
// transfer included); otherwise min(streams, ceil(bytes /
// kTransferAlignment)) non-empty ranges that cover [0, bytes) in order, each
// beginning at a multiple of kTransferAlignment, of sizes that differ by at
// most kTransferAlignment (apart from the short tail of the last).
// REQUIRES: bytes >= 0.
std::vector<ByteRange> SplitTransfer(int64_t bytes, int streams, int64_t parallel_min_bytes);

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
//
// Unary calls and Batch go over one channel. Uploads and downloads go over
// channels of their own, opened on first use: stream i of a transfer over
// the i-th, each with its own TCP connection, so that a large transfer
// neither waits behind nor delays the unary calls. Resident tensors live on
// one server: a target that balances over several (lb_policy round_robin)
// suits them only with one server behind it.
class Client {
 public:
  // Builds the channel (it connects lazily, on the first call). Errors:
  // INVALID_ARGUMENT for inconsistent options (streams outside [1, 64],
  // chunk_bytes < 1, a negative parallel_min_bytes, a session that is not
  // printable ASCII, both token and token_file, ...), NOT_FOUND when a TLS
  // or token file cannot be read.
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

  // Streams `count` requests over Batch calls and collects the answers.
  // request_at(i) returns request i; the reference must stay valid until the
  // next call of request_at (calls are serialised, and each request is
  // serialized before the next call, so a caller may reuse one message; the
  // streams write in parallel). Ids must be unique. At
  // most `max_outstanding` requests are unanswered at any time (0: no limit).
  // `streams` Batch calls run at once, stream s carrying requests s,
  // s + streams, ... and its share of max_outstanding: stream 0 over the
  // client's channel, stream s > 0 over the s-th transfer connection. One
  // stream carries about 20,000 small items a second over loopback on the
  // GPU host; several lift a batch job past that. The deadline covers the
  // whole job. Returns the answers in request order, failed items included
  // (their code != 0). Errors: the first failed stream's status when a
  // stream itself fails; INTERNAL when the server answers an unknown or
  // repeated id or leaves one unanswered, or sends an answer that does not
  // parse; INVALID_ARGUMENT for a repeated request id, a request protobuf
  // cannot serialize (over 2 GB), or streams outside [1, 64].
  absl::StatusOr<std::vector<BatchItem>> Batch(
      int64_t count, const std::function<const v1::BatchRequest&(int64_t)>& request_at,
      const CallOptions& call = {}, int max_outstanding = 0, int streams = 1) const;
  // The same over a vector of requests.
  absl::StatusOr<std::vector<BatchItem>> Batch(const std::vector<v1::BatchRequest>& requests,
                                               const CallOptions& call = {},
                                               int max_outstanding = 0, int streams = 1) const;

  // grpc.health.v1 Check of `service` ("" = the whole server;
  // "gpucompute.v1.Compute" = the compute service).
  absl::StatusOr<ServingStatus> Health(const std::string& service = "",
                                       const CallOptions& call = {}) const;

  // Resident tensors. Each transfer is cut by SplitTransfer(bytes, streams,
  // parallel_min_bytes) and its streams run at once, one thread each beyond
  // the calling thread; the deadline covers the whole transfer. When one
  // stream fails the others are cancelled and the first failure is returned.

  // Puts the tensor of `dtype` and `shape` whose product(shape) *
  // ElementSize(dtype) bytes are at `data` on the server; returns its
  // TensorInfo (handle, dtype, shape, bytes, device). `data` is only read, and
  // only during the call; each byte is copied once into a message. Errors:
  // INVALID_ARGUMENT for an unspecified dtype, an invalid shape or more than
  // 64 streams (before anything is sent); otherwise the server's (INVALID_ARGUMENT,
  // RESOURCE_EXHAUSTED when the tensor does not fit under the caller's quota
  // or on the device); INTERNAL when the server answers a parallel upload's
  // streams with different tensors.
  // REQUIRES: data points to the whole tensor (it may be null for 0 bytes).
  absl::StatusOr<v1::TensorInfo> Upload(v1::DType dtype, const std::vector<int64_t>& shape,
                                        const void* data, const UploadOptions& upload = {},
                                        const CallOptions& call = {}) const;
  // The same for an inline tensor. INVALID_ARGUMENT as CheckTensor, or when
  // the tensor is a handle.
  absl::StatusOr<v1::TensorInfo> Upload(const v1::Tensor& tensor, const UploadOptions& upload = {},
                                        const CallOptions& call = {}) const;
  // The same with the bytes written by `source` straight into each message,
  // so that a tensor never has to be whole in the client's memory. Errors as
  // Upload, or the source's.
  absl::StatusOr<v1::TensorInfo> UploadFrom(v1::DType dtype, const std::vector<int64_t>& shape,
                                            const UploadSource& source,
                                            const UploadOptions& upload = {},
                                            const CallOptions& call = {}) const;

  // Copies the resident tensor `handle` into `dst`, each chunk straight to
  // its offset. The size comes from the first message of the first stream,
  // which asks for the whole tensor; a parallel download then starts the
  // other streams on the later parts and cancels the first once it has
  // delivered its own part (the server sees that Download end CANCELLED).
  // Errors: INVALID_ARGUMENT when dst_bytes is not the tensor's size (dst
  // untouched); NOT_FOUND for a handle that is unknown, freed or another
  // session's; INTERNAL when the server's stream breaks the protocol (no
  // TensorInfo first, chunks out of order or short, streams that disagree).
  // On an error dst may hold part of the tensor.
  absl::Status Download(const std::string& handle, void* dst, int64_t dst_bytes,
                        const DownloadOptions& download = {}, const CallOptions& call = {}) const;
  // The resident tensor as an inline Tensor (dtype, shape and data). Errors
  // as Download.
  absl::StatusOr<v1::Tensor> DownloadTensor(const std::string& handle,
                                            const DownloadOptions& download = {},
                                            const CallOptions& call = {}) const;
  // Hands every byte of the resident tensor to `sink`; returns its
  // TensorInfo. Errors as Download, or the sink's.
  absl::StatusOr<v1::TensorInfo> DownloadTo(const std::string& handle, const DownloadSink& sink,
                                            const DownloadOptions& download = {},
                                            const CallOptions& call = {}) const;

  // Frees every one of `handles`, or none: NOT_FOUND naming the first that
  // is unknown, freed already or another session's.
  absl::StatusOr<v1::FreeResponse> Free(const std::vector<std::string>& handles,
                                        const CallOptions& call = {}) const;
  // This session's resident tensors, the bytes they hold and its quota.
  absl::StatusOr<v1::ListTensorsResponse> ListTensors(const CallOptions& call = {}) const;

  const ClientOptions& options() const { return options_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  Client(ClientOptions options, std::string channel_target,
         std::shared_ptr<grpc::ChannelCredentials> credentials, grpc::ChannelArguments args);

  // The stub of transfer stream `i`, on a channel of its own (made on first
  // use).
  // One operation: as one unary message, or through resident tensors when
  // its inline operands reach offload_min_bytes.
  template <typename Request, typename Response>
  absl::StatusOr<Response> RunOp(const Request& request, const CallOptions& call,
                                 grpc::Status (v1::Compute::Stub::*method)(grpc::ClientContext*,
                                                                           const Request&,
                                                                           Response*)) const;
  // UploadFrom, sending from `direct` without a copy when not null.
  absl::StatusOr<v1::TensorInfo> UploadImpl(v1::DType dtype, const std::vector<int64_t>& shape,
                                            const UploadSource& source, const char* direct,
                                            const UploadOptions& upload,
                                            const CallOptions& call) const;
  // The channel of transfer stream i, on a connection of its own.
  grpc::Channel* TransferChannel(int i) const;

  // Download, DownloadTensor and DownloadTo: `on_info` sees the TensorInfo
  // before any byte goes to `sink`; its error stops the download.
  absl::StatusOr<v1::TensorInfo> DownloadWith(
      const std::string& handle, const std::function<absl::Status(const v1::TensorInfo&)>& on_info,
      const DownloadSink& sink, const DownloadOptions& download, const CallOptions& call) const;

  ClientOptions options_;
  std::string channel_target_;  // ChannelTarget(options_.target)
  // Calls are spread over several servers (round_robin): a resident tensor
  // made by one call may not be on the server of the next, so large inline
  // operations are not offloaded.
  bool balanced_ = false;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  grpc::ChannelArguments args_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Compute::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
  mutable absl::Mutex transfer_mu_;
  mutable std::vector<std::shared_ptr<grpc::Channel>> transfer_channels_
      ABSL_GUARDED_BY(transfer_mu_);
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

// An operand naming the resident tensor `handle` (dtype and shape unset: the
// server takes the resident tensor's).
v1::Tensor HandleTensor(const std::string& handle);

// product(shape) * ElementSize(dtype). INVALID_ARGUMENT for an unspecified
// dtype, an invalid shape or a size over int64.
absl::StatusOr<int64_t> TensorBytes(v1::DType dtype, const std::vector<int64_t>& shape);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_CLIENT_H_
