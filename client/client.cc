#include "client/client.h"

#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

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

// Applies the deadline and wait-for-ready of one call.
void Configure(const ClientOptions& options, const CallOptions& call, grpc::ClientContext& ctx) {
  absl::Duration timeout =
      call.timeout > absl::ZeroDuration() ? call.timeout : options.default_timeout;
  if (timeout != absl::InfiniteDuration()) {
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  }
  ctx.set_wait_for_ready(call.wait_for_ready);
}

// One unary call on `stub` through the member function `method`.
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Unary(const ClientOptions& options, const CallOptions& call, Stub& stub,
                               grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                            Response*),
                               const Request& request) {
  grpc::ClientContext ctx;
  Configure(options, call, ctx);
  Response response;
  grpc::Status status = (stub.*method)(&ctx, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

}  // namespace

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

  grpc::ChannelArguments args;
  int max_message = static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT_MAX));
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  if (!options.lb_policy.empty()) args.SetLoadBalancingPolicyName(options.lb_policy);
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
  auto channel = grpc::CreateCustomChannel(options.target, credentials, args);
  return std::unique_ptr<Client>(new Client(std::move(options), std::move(channel)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Compute::NewStub(channel_)),
      health_stub_(grpc::health::v1::Health::NewStub(channel_)) {}

absl::StatusOr<v1::GemmResponse> Client::Gemm(const v1::GemmRequest& request,
                                              const CallOptions& call) const {
  return Unary(options_, call, *stub_, &v1::Compute::Stub::Gemm, request);
}

absl::StatusOr<v1::GemvResponse> Client::Gemv(const v1::GemvRequest& request,
                                              const CallOptions& call) const {
  return Unary(options_, call, *stub_, &v1::Compute::Stub::Gemv, request);
}

absl::StatusOr<v1::ReduceResponse> Client::Reduce(const v1::ReduceRequest& request,
                                                  const CallOptions& call) const {
  return Unary(options_, call, *stub_, &v1::Compute::Stub::Reduce, request);
}

absl::StatusOr<v1::TransposeResponse> Client::Transpose(const v1::TransposeRequest& request,
                                                        const CallOptions& call) const {
  return Unary(options_, call, *stub_, &v1::Compute::Stub::Transpose, request);
}

absl::StatusOr<v1::AttentionResponse> Client::Attention(const v1::AttentionRequest& request,
                                                        const CallOptions& call) const {
  return Unary(options_, call, *stub_, &v1::Compute::Stub::Attention, request);
}

absl::StatusOr<v1::EchoResponse> Client::Echo(const v1::EchoRequest& request,
                                              const CallOptions& call) const {
  return Unary(options_, call, *stub_, &v1::Compute::Stub::Echo, request);
}

absl::StatusOr<v1::ServerInfoResponse> Client::GetServerInfo(const CallOptions& call) const {
  return Unary(options_, call, *stub_, &v1::Compute::Stub::GetServerInfo, v1::ServerInfoRequest());
}

absl::StatusOr<ServingStatus> Client::Health(const std::string& service,
                                             const CallOptions& call) const {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  auto response =
      Unary(options_, call, *health_stub_, &grpc::health::v1::Health::Stub::Check, request);
  if (!response.ok()) return response.status();
  return response->status();
}

absl::StatusOr<std::vector<BatchItem>> Client::Batch(const std::vector<v1::BatchRequest>& requests,
                                                     const CallOptions& call,
                                                     int max_outstanding) const {
  return Batch(
      static_cast<int64_t>(requests.size()),
      [&requests](int64_t i) -> const v1::BatchRequest& { return requests[i]; }, call,
      max_outstanding);
}

absl::StatusOr<std::vector<BatchItem>> Client::Batch(
    int64_t count, const std::function<const v1::BatchRequest&(int64_t)>& request_at,
    const CallOptions& call, int max_outstanding) const {
  grpc::ClientContext ctx;
  Configure(options_, call, ctx);
  std::unique_ptr<grpc::ClientReaderWriter<v1::BatchRequest, v1::BatchResponse>> stream =
      stub_->Batch(&ctx);

  // Shared between the writer thread and the reader (this thread).
  struct State {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, int64_t> index_of ABSL_GUARDED_BY(mu);
    std::vector<absl::Time> sent_at ABSL_GUARDED_BY(mu);
    std::vector<std::string> ids ABSL_GUARDED_BY(mu);
    int64_t outstanding ABSL_GUARDED_BY(mu) = 0;
    bool stop ABSL_GUARDED_BY(mu) = false;
    absl::Status error ABSL_GUARDED_BY(mu);  // a client-side failure
  } state;
  {
    absl::MutexLock lock(&state.mu);
    state.sent_at.assign(count, absl::InfinitePast());
    state.ids.resize(count);
  }
  std::vector<BatchItem> items(count);
  std::vector<bool> answered(count, false);

  std::thread writer([&] {
    for (int64_t i = 0; i < count; ++i) {
      const v1::BatchRequest& request = request_at(i);
      {
        absl::MutexLock lock(&state.mu);
        auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
          return state.stop || max_outstanding <= 0 || state.outstanding < max_outstanding;
        };
        state.mu.Await(absl::Condition(&room));
        if (state.stop) return;
        if (!state.index_of.emplace(request.id(), i).second) {
          state.error = absl::InvalidArgumentError(
              absl::StrCat("requests[", i, "].id: \"", request.id(), "\" is used twice"));
          state.stop = true;
          ctx.TryCancel();
          return;
        }
        ++state.outstanding;
        state.sent_at[i] = absl::Now();
        state.ids[i] = request.id();
      }
      if (!stream->Write(request)) return;  // the stream broke; Finish says why
    }
    stream->WritesDone();
  });

  v1::BatchResponse response;
  while (stream->Read(&response)) {
    absl::Time now = absl::Now();
    absl::MutexLock lock(&state.mu);
    auto it = state.index_of.find(response.id());
    if (it == state.index_of.end() || answered[it->second]) {
      state.error = absl::InternalError(absl::StrCat(
          "batch: the server answered ", it == state.index_of.end() ? "unknown" : "repeated",
          " id \"", response.id(), "\""));
      state.stop = true;
      ctx.TryCancel();
      break;
    }
    int64_t i = it->second;
    answered[i] = true;
    items[i].latency_seconds = absl::ToDoubleSeconds(now - state.sent_at[i]);
    items[i].response = std::move(response);
    response.Clear();
    --state.outstanding;
  }
  {
    absl::MutexLock lock(&state.mu);
    state.stop = true;
  }
  writer.join();
  grpc::Status status = stream->Finish();

  absl::MutexLock lock(&state.mu);
  if (!state.error.ok()) return state.error;
  if (!status.ok()) return FromGrpc(status);
  for (int64_t i = 0; i < count; ++i) {
    if (!answered[i]) {
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

}  // namespace gpucompute
