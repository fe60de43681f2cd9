#include "client/client.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/field_mask.pb.h"
#include "google/protobuf/util/field_mask_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/wire.h"

namespace gpucompute {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, ": cannot read ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

using Deadline = std::optional<std::chrono::system_clock::time_point>;

// The deadline of a call starting now; nullopt for none.
Deadline DeadlineOf(const ClientOptions& options, const CallOptions& call) {
  absl::Duration timeout =
      call.timeout > absl::ZeroDuration() ? call.timeout : options.default_timeout;
  if (timeout == absl::InfiniteDuration()) return std::nullopt;
  return std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout);
}

// Applies the deadline, wait-for-ready and session of one call.
void Configure(const ClientOptions& options, const CallOptions& call, const Deadline& deadline,
               grpc::ClientContext& ctx) {
  if (deadline) ctx.set_deadline(*deadline);
  ctx.set_wait_for_ready(call.wait_for_ready);
  if (!options.session.empty()) ctx.AddMetadata(kSessionMetadataKey, options.session);
  if (!options.token.empty()) {
    ctx.AddMetadata(kAuthorizationMetadataKey, absl::StrCat("Bearer ", options.token));
  }
}

void Configure(const ClientOptions& options, const CallOptions& call, grpc::ClientContext& ctx) {
  Configure(options, call, DeadlineOf(options, call), ctx);
}

// Unless the call waits for readiness anyway: waits until `channel` has a
// connection, for at most options.connect_timeout and half the call's
// timeout. Without it, one failed connection attempt (gRPC then backs off
// before the next) fails every call started in the meantime, however briefly
// the server was out of reach.
void AwaitConnection(grpc::Channel* channel, const ClientOptions& options,
                     const CallOptions& call) {
  if (call.wait_for_ready || options.connect_timeout <= absl::ZeroDuration()) return;
  if (channel->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return;
  const absl::Duration timeout =
      call.timeout > absl::ZeroDuration() ? call.timeout : options.default_timeout;
  const absl::Duration wait = std::min(options.connect_timeout, timeout / 2);
  channel->WaitForConnected(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(wait));
}

// Most streams of one transfer (each is a thread of the caller's).
constexpr int kMaxStreams = 64;
// Room in a transfer message for the fields beside its chunk of data (the
// header with up to 8 dimensions and an upload id, the offset).
constexpr int64_t kMessageOverhead = 1024;

// The streams of one transfer: their contexts (one deadline for all), and
// the first failure among them, which cancels the others (their CANCELLED
// is then a consequence, not the news).
class StreamGroup {
 public:
  StreamGroup(size_t streams, const ClientOptions& options, const CallOptions& call) {
    Deadline deadline = DeadlineOf(options, call);
    for (size_t i = 0; i < streams; ++i) {
      contexts_.push_back(std::make_unique<grpc::ClientContext>());
      Configure(options, call, deadline, *contexts_.back());
    }
  }
  StreamGroup(const StreamGroup&) = delete;
  StreamGroup& operator=(const StreamGroup&) = delete;

  grpc::ClientContext& context(size_t i) { return *contexts_[i]; }

  // Records the failure of one stream; the first cancels every stream.
  void Fail(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return;
    error_ = std::move(status);
    for (auto& ctx : contexts_) ctx->TryCancel();
  }

  // OK, or the first failure.
  absl::Status error() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// Runs body(i) for every i in [0, n): 0 on the calling thread, the others on
// threads of their own.
void RunStreams(size_t n, const std::function<void(size_t)>& body) {
  std::vector<std::thread> threads;
  for (size_t i = 1; i < n; ++i) threads.emplace_back(body, i);
  body(0);
  for (std::thread& t : threads) t.join();
}

// A fresh id for the parts of one upload (unique among this client's uploads
// in flight: 128 random bits).
std::string NewUploadId() {
  std::random_device device;
  auto word = [&device] { return (uint64_t{device()} << 32) | device(); };
  return absl::StrCat(absl::Hex(word(), absl::kZeroPad16), absl::Hex(word(), absl::kZeroPad16));
}

// The streams and chunk size of one transfer: the per-transfer overrides or
// the client's, the chunk cut down to fit in a message. INVALID_ARGUMENT for
// too many streams.
absl::Status TransferSettings(const ClientOptions& options, int streams_override,
                              int64_t chunk_override, int& streams, int64_t& chunk_bytes) {
  streams = streams_override > 0 ? streams_override : options.streams;
  chunk_bytes = chunk_override > 0 ? chunk_override : options.chunk_bytes;
  if (streams > kMaxStreams) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams: ", streams, " is more than ", kMaxStreams));
  }
  chunk_bytes =
      std::min(chunk_bytes, std::max<int64_t>(1, options.max_message_bytes - kMessageOverhead));
  return absl::OkStatus();
}

// The transfer streams are raw calls (proto/wire.h): a chunk is sent from
// the caller's memory (or one buffer the source fills) and received without
// protobuf copying its bytes.
const grpc::internal::RpcMethod& UploadMethod() {
  static const grpc::internal::RpcMethod method("/gpucompute.v1.Compute/Upload",
                                                grpc::internal::RpcMethod::CLIENT_STREAMING);
  return method;
}
const grpc::internal::RpcMethod& DownloadMethod() {
  static const grpc::internal::RpcMethod method("/gpucompute.v1.Compute/Download",
                                                grpc::internal::RpcMethod::SERVER_STREAMING);
  return method;
}

// Parses a message with no large bytes fields (or with them copied).
absl::Status ParseRaw(const grpc::ByteBuffer& raw, google::protobuf::Message* message,
                      absl::string_view what) {
  std::vector<wire::ExternalField> external;
  absl::Status status = wire::Parse(raw, message, &external, wire::kDefaultMinExternalBytes, what);
  if (!status.ok()) return absl::InternalError(absl::StrCat("the server's ", status.message()));
  wire::Materialize(&external);
  return absl::OkStatus();
}

// Sends one upload stream: `header`, then the bytes `part` in chunks of at
// most chunk_bytes (one empty chunk for an empty tensor). The bytes are sent
// from `direct` (the whole tensor in memory: no copy) when it is not null,
// else copied out of `source`; gRPC holds `direct` (a copy of the token
// for each chunk) until it is done with the bytes. Returns OK once the server
// answered with a TensorInfo in `response`.
absl::Status SendUpload(grpc::Channel* channel, grpc::ClientContext& ctx,
                        const v1::UploadHeader& header, ByteRange part, int64_t chunk_bytes,
                        const UploadSource& source, const std::shared_ptr<const void>& direct,
                        v1::UploadResponse& response) {
  const google::protobuf::FieldDescriptor* data_field =
      wire::Field(v1::UploadRequest::descriptor(), "data");
  grpc::ByteBuffer raw_response;
  absl::Status source_status;
  grpc::Status status;
  {
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel, UploadMethod(), &ctx,
                                                                      &raw_response));
    v1::UploadRequest message;
    *message.mutable_header() = header;
    bool sent_all = true;
    int64_t offset = part.begin;
    do {
      const int64_t n = std::min(chunk_bytes, part.end - offset);
      message.set_offset(offset);
      wire::Attachment data{{data_field}, nullptr, n, nullptr};
      if (direct != nullptr) {
        data.data = static_cast<const char*>(direct.get()) + offset;
        data.keep_alive = direct;
      } else if (n > 0) {
        std::shared_ptr<char[]> buffer(new char[static_cast<size_t>(n)]);
        source_status = source(offset, n, buffer.get());
        data.data = buffer.get();
        data.keep_alive = std::move(buffer);
      }
      if (!source_status.ok()) {
        ctx.TryCancel();
        sent_all = false;
        break;
      }
      std::vector<wire::Attachment> attachments;
      if (n > 0) attachments.push_back(std::move(data));
      if (!writer->Write(wire::Serialize(message, std::move(attachments)))) {
        sent_all = false;  // the stream broke: Finish says why
        break;
      }
      message.clear_header();
      offset += n;
    } while (offset < part.end);
    if (sent_all) writer->WritesDone();
    status = writer->Finish();
  }
  if (!source_status.ok()) return source_status;
  if (!status.ok()) return FromGrpc(status);
  if (absl::Status parsed = ParseRaw(raw_response, &response, "upload response"); !parsed.ok()) {
    return parsed;
  }
  if (!response.has_tensor()) {
    return absl::InternalError("upload: the server answered without a TensorInfo");
  }
  return absl::OkStatus();
}

// One message of a Download stream, its data left in gRPC's slices.
struct DownloadChunk {
  v1::DownloadResponse message;
  std::vector<wire::ExternalField> external;
  int64_t size() const {
    return external.empty() ? static_cast<int64_t>(message.data().size())
                            : external.front().bytes.size();
  }
  // Hands the bytes [0, n) to `sink` at `offset`, piece by piece.
  absl::Status Deliver(int64_t offset, int64_t n, const DownloadSink& sink) const {
    if (external.empty()) return sink(offset, message.data().data(), n);
    absl::Status status;
    external.front().bytes.ForEach([&](const char* data, size_t size) {
      const int64_t piece = std::min<int64_t>(n, static_cast<int64_t>(size));
      if (!status.ok() || piece <= 0) return;
      status = sink(offset, data, piece);
      offset += piece;
      n -= piece;
    });
    return status;
  }
};

// Reads the next message of `reader` into `chunk`; false at the end of the
// stream, with *error set when the message was not a DownloadResponse.
bool ReadChunk(grpc::ClientReader<grpc::ByteBuffer>& reader, DownloadChunk& chunk,
               absl::Status* error) {
  grpc::ByteBuffer raw;
  if (!reader.Read(&raw)) return false;
  absl::Status status = wire::Parse(raw, &chunk.message, &chunk.external,
                                    wire::kDefaultMinExternalBytes, "download message");
  if (!status.ok()) {
    *error = absl::InternalError(absl::StrCat("the server's ", status.message()));
    return false;
  }
  return true;
}

// Reads the rest of one Download stream that asked for the bytes from
// `asked.begin` to `asked.end`; `chunk` holds its first message. The bytes
// below `until` go to `sink`. When until < asked.end the stream is cancelled
// once they are in; otherwise it is read to its end, which must be
// asked.end. Errors: the stream's status, the sink's, INTERNAL for a chunk
// out of order, past the range or missing.
absl::Status ReceiveDownload(grpc::ClientReader<grpc::ByteBuffer>& reader, grpc::ClientContext& ctx,
                             DownloadChunk& chunk, ByteRange asked, int64_t until,
                             const DownloadSink& sink) {
  absl::Status error;
  int64_t next = asked.begin;
  bool more = true;
  while (more) {
    const int64_t n = chunk.size();
    if (chunk.message.offset() != next || n > asked.end - next) {
      error = absl::InternalError(
          absl::StrCat("download: the server sent bytes [", chunk.message.offset(), ", ",
                       chunk.message.offset() + n, ") where [", next, ", ...) of [", asked.begin,
                       ", ", asked.end, ") was due"));
      break;
    }
    const int64_t wanted = std::min(n, until - next);
    if (wanted > 0) {
      error = chunk.Deliver(next, wanted, sink);
      if (!error.ok()) break;
    }
    next += n;
    if (next >= until && until < asked.end) {  // the later bytes are another stream's
      ctx.TryCancel();
      reader.Finish();
      return absl::OkStatus();
    }
    more = ReadChunk(reader, chunk, &error);
  }
  if (!error.ok()) {
    ctx.TryCancel();
    reader.Finish();
    return error;
  }
  grpc::Status status = reader.Finish();
  if (!status.ok()) return FromGrpc(status);
  if (next != asked.end) {
    return absl::InternalError(absl::StrCat("download: the stream ended at byte ", next, " of [",
                                            asked.begin, ", ", asked.end, ")"));
  }
  return absl::OkStatus();
}

// Starts a Download stream for `request` on `channel`.
std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> StartDownload(
    grpc::Channel* channel, grpc::ClientContext& ctx, const v1::DownloadRequest& request) {
  return std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel, DownloadMethod(), &ctx,
                                                                    wire::Serialize(request)));
}

// One unary call on `stub`, a stub of `channel`, through the member function
// `method`.
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Unary(const ClientOptions& options, const CallOptions& call,
                               grpc::Channel* channel, Stub& stub,
                               grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                            Response*),
                               const Request& request) {
  AwaitConnection(channel, options, call);
  grpc::ClientContext ctx;
  Configure(options, call, ctx);
  ctx.AddMetadata(kRequestBytesMetadataKey, absl::StrCat(request.ByteSizeLong()));
  Response response;
  grpc::Status status = (stub.*method)(&ctx, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

}  // namespace

absl::StatusOr<std::string> ChannelTarget(const std::string& target) {
  if (target.find(',') == std::string::npos || absl::StrContains(target, "://") ||
      absl::StartsWith(target, "ipv4:") || absl::StartsWith(target, "ipv6:") ||
      absl::StartsWith(target, "unix:")) {
    return target;
  }
  bool v4 = false, v6 = false;
  std::vector<std::string> addresses;
  for (absl::string_view item : absl::StrSplit(target, ',')) {
    std::string address(absl::StripAsciiWhitespace(item));
    const size_t colon = address.rfind(':');
    const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
        port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("target: \"", address, "\" in the list is not address:port"));
    }
    in_addr a4{};
    in6_addr a6{};
    if (host == "localhost") {
      address = absl::StrCat("127.0.0.1:", port);
      v4 = true;
    } else if (inet_pton(AF_INET, host.c_str(), &a4) == 1) {
      v4 = true;
    } else if (host.size() > 2 && host.front() == '[' && host.back() == ']' &&
               inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a6) == 1) {
      v6 = true;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("target: \"", host,
                       "\" in the list is not an IP address (a list is not resolved; for "
                       "names use one dns:///name:port target that resolves to every replica)"));
    }
    addresses.push_back(address);
  }
  if (v4 && v6) {
    return absl::InvalidArgumentError("target: a list holds IPv4 or IPv6 addresses, not both");
  }
  return absl::StrCat(v4 ? "ipv4:" : "ipv6:", absl::StrJoin(addresses, ","));
}

std::string RetryServiceConfig(int max_attempts) {
  if (max_attempts <= 1) return "{}";
  std::vector<std::string> names;
  for (const char* method : {"Gemm", "Gemv", "Reduce", "Transpose", "Attention", "Echo",
                             "GetServerInfo", "ListTensors", "Download"}) {
    names.push_back(
        absl::StrCat(R"({"service": "gpucompute.v1.Compute", "method": ")", method, R"("})"));
  }
  names.push_back(R"({"service": "grpc.health.v1.Health", "method": "Check"})");
  return absl::StrCat(
      R"({"methodConfig": [{"name": [)", absl::StrJoin(names, ", "),
      R"(], "retryPolicy": {"maxAttempts": )", max_attempts,
      R"(, "initialBackoff": "0.05s", "maxBackoff": "1s", )",
      R"("backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"]}}]})");
}

std::vector<ByteRange> SplitTransfer(int64_t bytes, int streams, int64_t parallel_min_bytes) {
  if (streams <= 1 || bytes == 0 || bytes < parallel_min_bytes) return {ByteRange{0, bytes}};
  const int64_t units = (bytes + kTransferAlignment - 1) / kTransferAlignment;
  const int64_t parts = std::min<int64_t>(streams, units);
  std::vector<ByteRange> ranges(parts);
  for (int64_t i = 0; i < parts; ++i) {
    ranges[i].begin = units * i / parts * kTransferAlignment;
    ranges[i].end = i + 1 < parts ? units * (i + 1) / parts * kTransferAlignment : bytes;
  }
  return ranges;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  if (options.target.empty()) return absl::InvalidArgumentError("target: empty");
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("max_message_bytes: must be positive");
  }
  if (options.default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_timeout: must be positive");
  }
  if (options.client_cert_path.empty() != options.client_key_path.empty()) {
    return absl::InvalidArgumentError(
        "client_cert_path, client_key_path: give both (mutual TLS) or neither");
  }
  if (!options.use_tls && (!options.root_certs_path.empty() || !options.client_cert_path.empty() ||
                           !options.tls_server_name.empty())) {
    return absl::InvalidArgumentError("use_tls: TLS files or server name given without TLS");
  }
  if (options.streams < 1 || options.streams > kMaxStreams) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams: ", options.streams, " is not in [1, ", kMaxStreams, "]"));
  }
  if (options.chunk_bytes < 1) return absl::InvalidArgumentError("chunk_bytes: must be positive");
  if (options.parallel_min_bytes < 0) {
    return absl::InvalidArgumentError("parallel_min_bytes: negative");
  }
  for (char c : options.session) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError("session: not printable ASCII (it travels as metadata)");
    }
  }

  if (!options.token.empty() && !options.token_file.empty()) {
    return absl::InvalidArgumentError("token, token_file: give one or neither");
  }
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFile(options.token_file, "token_file");
    if (!token.ok()) return token.status();
    options.token = std::string(absl::StripAsciiWhitespace(*token));
    if (options.token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token_file: ", options.token_file, " holds no token"));
    }
  }
  for (char c : options.token) {
    if (c <= 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "token: not printable ASCII without spaces (it travels as metadata)");
    }
  }

  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: ", options.max_attempts, " is not >= 1"));
  }
  if (options.retry_buffer_bytes < 0) {
    return absl::InvalidArgumentError("retry_buffer_bytes: negative");
  }
  if (options.connect_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("connect_timeout: negative");
  }
  if (options.keepalive_time <= absl::ZeroDuration() ||
      options.keepalive_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("keepalive_time, keepalive_timeout: must be positive");
  }
  if (!options.lb_policy.empty() && options.lb_policy != "round_robin" &&
      options.lb_policy != "pick_first") {
    return absl::InvalidArgumentError(
        absl::StrCat("lb_policy: \"", options.lb_policy, "\" is not round_robin or pick_first"));
  }
  absl::StatusOr<std::string> channel_target = ChannelTarget(options.target);
  if (!channel_target.ok()) return channel_target.status();
  const bool listed = *channel_target != options.target;

  grpc::ChannelArguments args;
  int max_message = static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT_MAX));
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  if (!options.lb_policy.empty()) {
    args.SetLoadBalancingPolicyName(options.lb_policy);
  } else if (listed) {
    args.SetLoadBalancingPolicyName("round_robin");
  }
  // The retry policy is ours: a DNS TXT record does not replace it.
  args.SetServiceConfigJSON(RetryServiceConfig(options.max_attempts));
  args.SetInt(GRPC_ARG_SERVICE_CONFIG_DISABLE_RESOLUTION, 1);
  args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE,
              static_cast<int>(std::min<int64_t>(options.retry_buffer_bytes, INT_MAX)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(
                  std::min<int64_t>(absl::ToInt64Milliseconds(options.keepalive_time), INT_MAX)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(std::min<int64_t>(
                  absl::ToInt64Milliseconds(options.keepalive_timeout), INT_MAX)));
  // A failed connection attempt is tried again after 100 ms (gRPC's default
  // is 1 s), growing 1.6x with jitter up to 5 s (gRPC's: 120 s), so that a
  // server that was briefly out of reach or restarted is found again soon.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);

  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.use_tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options.root_certs_path.empty()) {
      auto roots = ReadFile(options.root_certs_path, "root_certs_path");
      if (!roots.ok()) return roots.status();
      ssl.pem_root_certs = *std::move(roots);
    }
    if (!options.client_cert_path.empty()) {
      auto cert = ReadFile(options.client_cert_path, "client_cert_path");
      if (!cert.ok()) return cert.status();
      auto key = ReadFile(options.client_key_path, "client_key_path");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  return std::unique_ptr<Client>(new Client(std::move(options), *std::move(channel_target),
                                            std::move(credentials), std::move(args)));
}

Client::Client(ClientOptions options, std::string channel_target,
               std::shared_ptr<grpc::ChannelCredentials> credentials, grpc::ChannelArguments args)
    : options_(std::move(options)),
      channel_target_(std::move(channel_target)),
      credentials_(std::move(credentials)),
      args_(std::move(args)),
      channel_(grpc::CreateCustomChannel(channel_target_, credentials_, args_)),
      stub_(v1::Compute::NewStub(channel_)),
      health_stub_(grpc::health::v1::Health::NewStub(channel_)) {
  balanced_ = options_.lb_policy == "round_robin" ||
              (options_.lb_policy.empty() && channel_target_ != options_.target);
}

grpc::Channel* Client::TransferChannel(int i) const {
  absl::MutexLock lock(&transfer_mu_);
  while (static_cast<int>(transfer_channels_.size()) <= i) {
    // A subchannel pool of its own gives the channel its own connection; the
    // distinct argument keeps any two of them from being taken as equal.
    grpc::ChannelArguments args = args_;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("gpucompute.connection", static_cast<int>(transfer_channels_.size()));
    transfer_channels_.push_back(grpc::CreateCustomChannel(channel_target_, credentials_, args));
  }
  return transfer_channels_[i].get();
}

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// The singular Tensor fields of `message` that are set.
std::vector<const FieldDescriptor*> TensorFields(const Message& message) {
  std::vector<const FieldDescriptor*> fields;
  message.GetReflection()->ListFields(message, &fields);
  std::vector<const FieldDescriptor*> tensors;
  for (const FieldDescriptor* f : fields) {
    if (!f->is_repeated() && f->message_type() == v1::Tensor::descriptor()) tensors.push_back(f);
  }
  return tensors;
}

const v1::Tensor& TensorAt(const Message& message, const FieldDescriptor* field) {
  return static_cast<const v1::Tensor&>(message.GetReflection()->GetMessage(message, field));
}
v1::Tensor* MutableTensorAt(Message* message, const FieldDescriptor* field) {
  return static_cast<v1::Tensor*>(message->GetReflection()->MutableMessage(message, field));
}

// What is left of a call's deadline, as the CallOptions of its next step.
CallOptions Remaining(absl::Time deadline, const CallOptions& call) {
  CallOptions next = call;
  next.timeout = deadline == absl::InfiniteFuture()
                     ? absl::InfiniteDuration()
                     : std::max(deadline - absl::Now(), absl::Nanoseconds(1));
  return next;
}

}  // namespace

template <typename Request, typename Response>
absl::StatusOr<Response> Client::RunOp(const Request& request, const CallOptions& call,
                                       grpc::Status (v1::Compute::Stub::*method)(
                                           grpc::ClientContext*, const Request&, Response*)) const {
  int64_t inline_bytes = 0;
  std::vector<const FieldDescriptor*> operands;
  for (const FieldDescriptor* f : TensorFields(request)) {
    const v1::Tensor& t = TensorAt(request, f);
    if (!t.data().empty() && t.handle().empty()) {
      operands.push_back(f);
      inline_bytes += static_cast<int64_t>(t.data().size());
    }
  }
  if (options_.offload_min_bytes <= 0 || inline_bytes < options_.offload_min_bytes || balanced_) {
    return Unary(options_, call, channel_.get(), *stub_, method, request);
  }
  const absl::Duration timeout =
      call.timeout == absl::ZeroDuration() ? options_.default_timeout : call.timeout;
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  std::vector<std::string> handles;  // freed at the end, whatever happens
  auto free_all = [&] {
    if (!handles.empty()) (void)Free(handles, Remaining(absl::Now() + absl::Seconds(10), call));
    handles.clear();
  };

  // The operands, uploaded. Any refusal (an older server without uploads, a
  // full quota, an operand the upload rejects) sends the call as one message
  // instead: the server then answers it, or names the field at fault.
  Request shell;
  google::protobuf::FieldMask mask;
  std::vector<const FieldDescriptor*> fields;
  request.GetReflection()->ListFields(request, &fields);
  for (const FieldDescriptor* f : fields) {
    if (std::find(operands.begin(), operands.end(), f) == operands.end()) {
      mask.add_paths(f->name());
    }
  }
  google::protobuf::util::FieldMaskUtil::MergeMessageTo(
      request, mask, google::protobuf::util::FieldMaskUtil::MergeOptions(), &shell);
  for (const FieldDescriptor* f : operands) {
    const v1::Tensor& t = TensorAt(request, f);
    absl::StatusOr<v1::TensorInfo> info =
        Upload(t.dtype(), ShapeOf(t), t.data().data(), UploadOptions(), Remaining(deadline, call));
    if (!info.ok()) {
      free_all();
      if (absl::IsDeadlineExceeded(info.status()) || absl::IsCancelled(info.status())) {
        return info.status();
      }
      return Unary(options_, Remaining(deadline, call), channel_.get(), *stub_, method, request);
    }
    handles.push_back(info->handle());
    v1::Tensor* operand = MutableTensorAt(&shell, f);
    *operand = HandleTensor(info->handle());
    operand->set_dtype(t.dtype());
    *operand->mutable_shape() = t.shape();
  }
  const bool keep = shell.options().keep_output();
  shell.mutable_options()->set_keep_output(true);
  absl::StatusOr<Response> response =
      Unary(options_, Remaining(deadline, call), channel_.get(), *stub_, method, shell);
  if (!response.ok()) {
    free_all();
    return response.status();
  }
  // The results, downloaded (unless the caller asked to keep them).
  if (!keep) {
    // Every result's handle is in `handles` before the first download, so
    // that a failed download frees them all (attention's LSE with its O).
    const std::vector<const FieldDescriptor*> results = TensorFields(*response);
    for (const FieldDescriptor* f : results) {
      const std::string& handle = TensorAt(*response, f).handle();
      if (!handle.empty()) handles.push_back(handle);
    }
    for (const FieldDescriptor* f : results) {
      const std::string handle = TensorAt(*response, f).handle();
      if (handle.empty()) continue;
      absl::StatusOr<v1::Tensor> result =
          DownloadTensor(handle, DownloadOptions(), Remaining(deadline, call));
      if (!result.ok()) {
        free_all();
        return result.status();
      }
      *MutableTensorAt(&*response, f) = *std::move(result);
    }
  }
  free_all();
  return response;
}

absl::StatusOr<v1::GemmResponse> Client::Gemm(const v1::GemmRequest& request,
                                              const CallOptions& call) const {
  return RunOp(request, call, &v1::Compute::Stub::Gemm);
}

absl::StatusOr<v1::GemvResponse> Client::Gemv(const v1::GemvRequest& request,
                                              const CallOptions& call) const {
  return RunOp(request, call, &v1::Compute::Stub::Gemv);
}

absl::StatusOr<v1::ReduceResponse> Client::Reduce(const v1::ReduceRequest& request,
                                                  const CallOptions& call) const {
  return RunOp(request, call, &v1::Compute::Stub::Reduce);
}

absl::StatusOr<v1::TransposeResponse> Client::Transpose(const v1::TransposeRequest& request,
                                                        const CallOptions& call) const {
  return RunOp(request, call, &v1::Compute::Stub::Transpose);
}

absl::StatusOr<v1::AttentionResponse> Client::Attention(const v1::AttentionRequest& request,
                                                        const CallOptions& call) const {
  return RunOp(request, call, &v1::Compute::Stub::Attention);
}

absl::StatusOr<v1::EchoResponse> Client::Echo(const v1::EchoRequest& request,
                                              const CallOptions& call) const {
  return Unary(options_, call, channel_.get(), *stub_, &v1::Compute::Stub::Echo, request);
}

absl::StatusOr<v1::ServerInfoResponse> Client::GetServerInfo(const CallOptions& call) const {
  return Unary(options_, call, channel_.get(), *stub_, &v1::Compute::Stub::GetServerInfo,
               v1::ServerInfoRequest());
}

absl::StatusOr<ServingStatus> Client::Health(const std::string& service,
                                             const CallOptions& call) const {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  auto response = Unary(options_, call, channel_.get(), *health_stub_,
                        &grpc::health::v1::Health::Stub::Check, request);
  if (!response.ok()) return response.status();
  return response->status();
}

absl::StatusOr<v1::TensorInfo> Client::Upload(v1::DType dtype, const std::vector<int64_t>& shape,
                                              const void* data, const UploadOptions& upload,
                                              const CallOptions& call) const {
  const char* bytes = static_cast<const char*>(data);
  return UploadImpl(
      dtype, shape,
      [bytes](int64_t offset, int64_t size, char* dst) {
        std::memcpy(dst, bytes + offset, size);
        return absl::OkStatus();
      },
      bytes, upload, call);
}

absl::StatusOr<v1::TensorInfo> Client::Upload(const v1::Tensor& tensor, const UploadOptions& upload,
                                              const CallOptions& call) const {
  if (!tensor.handle().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor: names the resident tensor \"", tensor.handle(), "\" already"));
  }
  if (absl::Status status = CheckTensor(tensor, "tensor"); !status.ok()) return status;
  return Upload(tensor.dtype(), ShapeOf(tensor), tensor.data().data(), upload, call);
}

absl::StatusOr<v1::TensorInfo> Client::UploadFrom(v1::DType dtype,
                                                  const std::vector<int64_t>& shape,
                                                  const UploadSource& source,
                                                  const UploadOptions& upload,
                                                  const CallOptions& call) const {
  return UploadImpl(dtype, shape, source, nullptr, upload, call);
}

absl::StatusOr<v1::TensorInfo> Client::UploadImpl(v1::DType dtype,
                                                  const std::vector<int64_t>& shape,
                                                  const UploadSource& source, const char* direct,
                                                  const UploadOptions& upload,
                                                  const CallOptions& call) const {
  absl::StatusOr<int64_t> bytes = TensorBytes(dtype, shape);
  if (!bytes.ok()) return bytes.status();
  int streams = 0;
  int64_t chunk_bytes = 0;
  if (absl::Status status =
          TransferSettings(options_, upload.streams, upload.chunk_bytes, streams, chunk_bytes);
      !status.ok()) {
    return status;
  }
  // Over several servers, the parts of one tensor must not land on different
  // ones: one stream.
  if (balanced_) streams = 1;
  const std::vector<ByteRange> parts = SplitTransfer(*bytes, streams, options_.parallel_min_bytes);

  v1::UploadHeader header;
  header.set_dtype(dtype);
  for (int64_t d : shape) header.add_shape(d);
  if (upload.device) header.set_device(*upload.device);
  if (parts.size() > 1) {
    header.set_upload_id(NewUploadId());
    header.set_parts(static_cast<int32_t>(parts.size()));
  }
  // gRPC references `direct` until the streams' calls are gone, which is
  // when their contexts are: the upload returns after that.
  absl::Notification released;
  std::shared_ptr<const void> direct_token;
  if (direct != nullptr) {
    direct_token.reset(direct, [&released](const void*) { released.Notify(); });
  }
  std::vector<v1::UploadResponse> responses(parts.size());
  absl::Status upload_status;
  {
    StreamGroup group(parts.size(), options_, call);
    RunStreams(parts.size(), [&](size_t i) {
      v1::UploadHeader part_header = header;
      if (parts.size() > 1) {
        part_header.set_part_begin(parts[i].begin);
        part_header.set_part_end(parts[i].end);
      }
      grpc::Channel* channel = TransferChannel(static_cast<int>(i));
      AwaitConnection(channel, options_, call);
      absl::Status status = SendUpload(channel, group.context(i), part_header, parts[i],
                                       chunk_bytes, source, direct_token, responses[i]);
      if (!status.ok()) group.Fail(std::move(status));
    });
    upload_status = group.error();
  }
  if (direct_token != nullptr) {
    direct_token.reset();
    released.WaitForNotification();
  }
  if (!upload_status.ok()) return upload_status;
  for (const v1::UploadResponse& response : responses) {
    if (response.tensor().handle() != responses[0].tensor().handle()) {
      return absl::InternalError(absl::StrCat(
          "upload: the server answered the parts of one upload with different tensors (\"",
          responses[0].tensor().handle(), "\", \"", response.tensor().handle(), "\")"));
    }
  }
  return responses[0].tensor();
}

absl::StatusOr<v1::TensorInfo> Client::DownloadWith(
    const std::string& handle, const std::function<absl::Status(const v1::TensorInfo&)>& on_info,
    const DownloadSink& sink, const DownloadOptions& download, const CallOptions& call) const {
  int streams = 0;
  int64_t chunk_bytes = 0;
  if (absl::Status status =
          TransferSettings(options_, download.streams, download.chunk_bytes, streams, chunk_bytes);
      !status.ok()) {
    return status;
  }
  if (balanced_) streams = 1;  // as in UploadImpl
  // Contexts for every stream the transfer may use, so that the first failure
  // can cancel all of them.
  StreamGroup group(streams, options_, call);

  // The first stream asks for everything; its first message tells the size.
  v1::DownloadRequest request;
  request.set_handle(handle);
  request.set_chunk_bytes(chunk_bytes);
  grpc::ClientContext& first_ctx = group.context(0);
  AwaitConnection(TransferChannel(0), options_, call);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> first =
      StartDownload(TransferChannel(0), first_ctx, request);
  DownloadChunk first_chunk;
  absl::Status read_error;
  if (!ReadChunk(*first, first_chunk, &read_error)) {
    grpc::Status status = first->Finish();
    if (!status.ok()) return FromGrpc(status);
    if (!read_error.ok()) return read_error;
    return absl::InternalError(
        absl::StrCat("download: the stream of \"", handle, "\" ended without a message"));
  }
  const v1::DownloadResponse& first_message = first_chunk.message;
  absl::Status info_status;
  if (!first_message.has_tensor()) {
    info_status = absl::InternalError(
        absl::StrCat("download: the first message for \"", handle, "\" has no TensorInfo"));
  } else if (first_message.tensor().bytes() < 0) {
    info_status = absl::InternalError(
        absl::StrCat("download: \"", handle, "\" has ", first_message.tensor().bytes(), " bytes"));
  } else {
    info_status = on_info(first_message.tensor());
  }
  if (!info_status.ok()) {
    first_ctx.TryCancel();
    first->Finish();
    return info_status;
  }
  const v1::TensorInfo info = first_message.tensor();
  const std::vector<ByteRange> parts =
      SplitTransfer(info.bytes(), streams, options_.parallel_min_bytes);

  RunStreams(parts.size(), [&](size_t i) {
    absl::Status status;
    if (i == 0) {
      status = ReceiveDownload(*first, first_ctx, first_chunk, ByteRange{0, info.bytes()},
                               parts[0].end, sink);
    } else {
      v1::DownloadRequest part_request = request;
      part_request.set_offset(parts[i].begin);
      part_request.set_length(parts[i].size());
      grpc::ClientContext& ctx = group.context(i);
      grpc::Channel* channel = TransferChannel(static_cast<int>(i));
      AwaitConnection(channel, options_, call);
      std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader =
          StartDownload(channel, ctx, part_request);
      DownloadChunk chunk;
      const v1::DownloadResponse& message = chunk.message;
      absl::Status read_error;
      if (!ReadChunk(*reader, chunk, &read_error)) {
        grpc::Status finished = reader->Finish();
        status = !finished.ok()     ? FromGrpc(finished)
                 : !read_error.ok() ? read_error
                                    : absl::InternalError(absl::StrCat(
                                          "download: the stream of bytes [", parts[i].begin, ", ",
                                          parts[i].end, ") ended without a message"));
      } else if (message.tensor().handle() != info.handle() ||
                 message.tensor().bytes() != info.bytes()) {
        ctx.TryCancel();
        reader->Finish();
        status = absl::InternalError(
            absl::StrCat("download: the stream of bytes [", parts[i].begin, ", ", parts[i].end,
                         ") began with another TensorInfo (\"", message.tensor().handle(), "\", ",
                         message.tensor().bytes(), " bytes) than the first (\"", info.handle(),
                         "\", ", info.bytes(), " bytes)"));
      } else {
        status = ReceiveDownload(*reader, ctx, chunk, parts[i], parts[i].end, sink);
      }
    }
    if (!status.ok()) group.Fail(std::move(status));
  });
  if (absl::Status status = group.error(); !status.ok()) return status;
  return info;
}

absl::Status Client::Download(const std::string& handle, void* dst, int64_t dst_bytes,
                              const DownloadOptions& download, const CallOptions& call) const {
  char* out = static_cast<char*>(dst);
  return DownloadWith(
             handle,
             [&](const v1::TensorInfo& info) {
               if (info.bytes() == dst_bytes) return absl::OkStatus();
               return absl::InvalidArgumentError(absl::StrCat(
                   "dst_bytes: ", dst_bytes, ", but \"", handle, "\" (", DTypeName(info.dtype()),
                   ShapeString(std::vector<int64_t>(info.shape().begin(), info.shape().end())),
                   ") has ", info.bytes(), " bytes"));
             },
             [out](int64_t offset, const char* data, int64_t size) {
               std::memcpy(out + offset, data, size);
               return absl::OkStatus();
             },
             download, call)
      .status();
}

absl::StatusOr<v1::Tensor> Client::DownloadTensor(const std::string& handle,
                                                  const DownloadOptions& download,
                                                  const CallOptions& call) const {
  v1::Tensor tensor;
  char* out = nullptr;
  absl::StatusOr<v1::TensorInfo> info = DownloadWith(
      handle,
      [&](const v1::TensorInfo& info) {
        tensor.set_dtype(info.dtype());
        *tensor.mutable_shape() = info.shape();
        tensor.mutable_data()->resize(info.bytes());
        out = tensor.mutable_data()->data();
        return absl::OkStatus();
      },
      [&out](int64_t offset, const char* data, int64_t size) {
        std::memcpy(out + offset, data, size);
        return absl::OkStatus();
      },
      download, call);
  if (!info.ok()) return info.status();
  return tensor;
}

absl::StatusOr<v1::TensorInfo> Client::DownloadTo(const std::string& handle,
                                                  const DownloadSink& sink,
                                                  const DownloadOptions& download,
                                                  const CallOptions& call) const {
  return DownloadWith(
      handle, [](const v1::TensorInfo&) { return absl::OkStatus(); }, sink, download, call);
}

absl::StatusOr<v1::FreeResponse> Client::Free(const std::vector<std::string>& handles,
                                              const CallOptions& call) const {
  v1::FreeRequest request;
  for (const std::string& handle : handles) request.add_handles(handle);
  return Unary(options_, call, channel_.get(), *stub_, &v1::Compute::Stub::Free, request);
}

absl::StatusOr<v1::ListTensorsResponse> Client::ListTensors(const CallOptions& call) const {
  return Unary(options_, call, channel_.get(), *stub_, &v1::Compute::Stub::ListTensors,
               v1::ListTensorsRequest());
}

absl::StatusOr<std::vector<BatchItem>> Client::Batch(const std::vector<v1::BatchRequest>& requests,
                                                     const CallOptions& call, int max_outstanding,
                                                     int streams) const {
  return Batch(
      static_cast<int64_t>(requests.size()),
      [&requests](int64_t i) -> const v1::BatchRequest& { return requests[i]; }, call,
      max_outstanding, streams);
}

absl::StatusOr<std::vector<BatchItem>> Client::Batch(
    int64_t count, const std::function<const v1::BatchRequest&(int64_t)>& request_at,
    const CallOptions& call, int max_outstanding, int streams) const {
  if (streams < 1 || streams > 64) {
    return absl::InvalidArgumentError(absl::StrCat("streams: expected 1 to 64 but got ", streams));
  }
  streams = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(streams, count)));
  // Each stream's share of the window (0: no limit).
  const int64_t window =
      max_outstanding <= 0 ? 0 : std::max<int64_t>(1, (max_outstanding + streams - 1) / streams);

  // Shared by every stream's writer and reader.
  struct State {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, int64_t> index_of ABSL_GUARDED_BY(mu);
    std::vector<absl::Time> sent_at ABSL_GUARDED_BY(mu);
    std::vector<std::string> ids ABSL_GUARDED_BY(mu);
    std::vector<bool> answered ABSL_GUARDED_BY(mu);
    bool stop ABSL_GUARDED_BY(mu) = false;
    absl::Status error ABSL_GUARDED_BY(mu);  // a client-side failure
  } state;
  {
    absl::MutexLock lock(&state.mu);
    state.sent_at.assign(count, absl::InfinitePast());
    state.ids.resize(count);
    state.answered.assign(count, false);
  }
  std::vector<BatchItem> items(count);
  // Held from request_at(i) until request i is serialized: the reference it
  // returns stays valid only until the next call. The write itself happens
  // after, so that streams send in parallel.
  absl::Mutex write_mu;

  // The streams are raw calls: a request is serialized under write_mu and
  // written outside it; an answer is parsed before state.mu is taken.
  static const grpc::internal::RpcMethod batch_method("/gpucompute.v1.Compute/Batch",
                                                      grpc::internal::RpcMethod::BIDI_STREAMING);
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> rw;
    int64_t outstanding = 0;  // under state.mu
  };
  std::vector<grpc::Channel*> channels(streams);
  for (int s = 0; s < streams; ++s) {
    channels[s] = s == 0 ? channel_.get() : TransferChannel(s - 1);
    // Every connection is asked for first, so that they are made together.
    if (!call.wait_for_ready) channels[s]->GetState(/*try_to_connect=*/true);
  }
  std::vector<std::unique_ptr<Stream>> all(streams);
  for (int s = 0; s < streams; ++s) {
    all[s] = std::make_unique<Stream>();
    Stream& st = *all[s];
    Configure(options_, call, st.ctx);
    AwaitConnection(channels[s], options_, call);
    st.rw.reset(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channels[s], batch_method, &st.ctx));
  }
  auto cancel_all = [&] {
    for (auto& st : all) st->ctx.TryCancel();
  };

  // Stream s writes requests s, s + streams, s + 2 streams, ...
  auto write = [&](int s) {
    Stream& st = *all[s];
    for (int64_t i = s; i < count; i += streams) {
      const bool last = i + streams >= count;
      {
        absl::MutexLock lock(&state.mu);
        auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
          return state.stop || window == 0 || st.outstanding < window;
        };
        state.mu.Await(absl::Condition(&room));
        if (state.stop) return;
      }
      grpc::ByteBuffer raw;
      bool more = false;
      {
        absl::MutexLock write_lock(&write_mu);
        const v1::BatchRequest& request = request_at(i);
        bool own_buffer = false;
        const grpc::Status serialized =
            grpc::SerializationTraits<v1::BatchRequest>::Serialize(request, &raw, &own_buffer);
        absl::MutexLock lock(&state.mu);
        if (state.stop) return;
        if (!serialized.ok()) {
          state.error = absl::InvalidArgumentError(
              absl::StrCat("requests[", i, "]: ", serialized.error_message()));
          state.stop = true;
          cancel_all();
          return;
        }
        if (!state.index_of.emplace(request.id(), i).second) {
          state.error = absl::InvalidArgumentError(
              absl::StrCat("requests[", i, "].id: \"", request.id(), "\" is used twice"));
          state.stop = true;
          cancel_all();
          return;
        }
        ++st.outstanding;
        state.sent_at[i] = absl::Now();
        state.ids[i] = request.id();
        // This stream's next request follows at once (there is room for it):
        // gRPC may hold this one back to send them together. The last one
        // before a wait for room is written without the hint, and flushes.
        more = !last && (window == 0 || st.outstanding < window);
      }
      grpc::WriteOptions options;
      if (more) options.set_buffer_hint();
      if (!st.rw->Write(raw, options)) return;  // the stream broke; Finish says why
    }
    st.rw->WritesDone();
  };
  auto read = [&](int s) {
    Stream& st = *all[s];
    v1::BatchResponse response;
    grpc::ByteBuffer raw;
    while (st.rw->Read(&raw)) {
      absl::Time now = absl::Now();
      const grpc::Status parsed =
          grpc::SerializationTraits<v1::BatchResponse>::Deserialize(&raw, &response);
      absl::MutexLock lock(&state.mu);
      if (!parsed.ok()) {
        state.error = absl::InternalError(
            absl::StrCat("batch: an answer could not be parsed: ", parsed.error_message()));
        state.stop = true;
        cancel_all();
        break;
      }
      auto it = state.index_of.find(response.id());
      if (it == state.index_of.end() || state.answered[it->second]) {
        state.error = absl::InternalError(absl::StrCat(
            "batch: the server answered ", it == state.index_of.end() ? "unknown" : "repeated",
            " id \"", response.id(), "\""));
        state.stop = true;
        cancel_all();
        break;
      }
      int64_t i = it->second;
      state.answered[i] = true;
      items[i].latency_seconds = absl::ToDoubleSeconds(now - state.sent_at[i]);
      items[i].response = std::move(response);
      response.Clear();
      --st.outstanding;
    }
  };

  // Per stream a writer thread and a reader (this thread reads stream 0).
  std::vector<std::thread> writers, readers;
  for (int s = 0; s < streams; ++s) {
    writers.emplace_back(write, s);
    if (s > 0) readers.emplace_back(read, s);
  }
  read(0);
  for (std::thread& t : readers) t.join();
  // A writer still waiting for room on a stream that has ended would wait
  // forever: every reader is done, so stop them.
  {
    absl::MutexLock lock(&state.mu);
    state.stop = true;
  }
  for (std::thread& t : writers) t.join();
  grpc::Status status;
  for (auto& st : all) {
    grpc::Status s = st->rw->Finish();
    if (status.ok() && !s.ok()) status = s;
  }

  absl::MutexLock lock(&state.mu);
  if (!state.error.ok()) return state.error;
  if (!status.ok()) return FromGrpc(status);
  for (int64_t i = 0; i < count; ++i) {
    if (!state.answered[i]) {
      return absl::InternalError(
          absl::StrCat("batch: request ", i, " (id \"", state.ids[i], "\") was not answered"));
    }
  }
  return items;
}

int64_t ElementSize(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return 4;
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

std::string DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return "float32";
    case v1::FLOAT16:
      return "float16";
    case v1::BFLOAT16:
      return "bfloat16";
    default:
      return "unspecified";
  }
}

absl::StatusOr<v1::DType> ParseDType(const std::string& name) {
  std::string n = absl::AsciiStrToLower(name);
  if (n == "float32" || n == "f32" || n == "fp32") return v1::FLOAT32;
  if (n == "float16" || n == "f16" || n == "fp16" || n == "half") return v1::FLOAT16;
  if (n == "bfloat16" || n == "bf16") return v1::BFLOAT16;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: \"", name, "\" is not one of float32, float16, bfloat16"));
}

absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("shape[", i, "]: ", shape[i], " < 0"));
    }
    if (shape[i] != 0 && n > INT64_MAX / shape[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape: ", ShapeString(shape), " has more than 2^63 elements"));
    }
    n *= shape[i];
  }
  return n;
}

v1::Tensor MakeTensor(v1::DType dtype, const std::vector<int64_t>& shape, std::string data) {
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  for (int64_t d : shape) tensor.add_shape(d);
  tensor.set_data(std::move(data));
  return tensor;
}

v1::Tensor MakeFloat32Tensor(const std::vector<int64_t>& shape, const std::vector<float>& values) {
  std::string data(values.size() * sizeof(float), '\0');
  if (!values.empty()) std::memcpy(data.data(), values.data(), data.size());
  return MakeTensor(v1::FLOAT32, shape, std::move(data));
}

std::vector<int64_t> ShapeOf(const v1::Tensor& tensor) {
  return std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end());
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::Status CheckTensor(const v1::Tensor& tensor, const std::string& name) {
  int64_t size = ElementSize(tensor.dtype());
  if (size == 0) return absl::InvalidArgumentError(absl::StrCat(name, ".dtype: unspecified"));
  auto n = ElementCount(ShapeOf(tensor));
  if (!n.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ".", n.status().message()));
  if (*n > INT64_MAX / size || static_cast<int64_t>(tensor.data().size()) != *n * size) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".data: ", tensor.data().size(), " bytes, expected ", *n, " x ", size));
  }
  return absl::OkStatus();
}

int64_t PayloadBytes(const v1::Tensor& tensor) {
  return static_cast<int64_t>(tensor.data().size());
}

v1::Tensor HandleTensor(const std::string& handle) {
  v1::Tensor tensor;
  tensor.set_handle(handle);
  return tensor;
}

absl::StatusOr<int64_t> TensorBytes(v1::DType dtype, const std::vector<int64_t>& shape) {
  const int64_t size = ElementSize(dtype);
  if (size == 0) return absl::InvalidArgumentError("dtype: unspecified");
  absl::StatusOr<int64_t> n = ElementCount(shape);
  if (!n.ok()) return n.status();
  if (*n > INT64_MAX / size) {
    return absl::InvalidArgumentError(absl::StrCat("shape: ", ShapeString(shape), " of ",
                                                   DTypeName(dtype), " has more than 2^63 bytes"));
  }
  return *n * size;
}

}  // namespace gpucompute
