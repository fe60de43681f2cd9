// Global flags of the CLI and the helpers every subcommand uses.
#include <cstring>
#include <iostream>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/cli/cli.h"
#include "client/npy.h"
#include "proto/dtype.h"

ABSL_FLAG(std::string, server, "localhost:50051",
          "Server address host:port; several replicas as IP addresses a:port,b:port; or a gRPC "
          "target such as dns:///name:port.");
ABSL_FLAG(std::string, lb_policy, "",
          "round_robin or pick_first (default: round_robin for a list of addresses, else "
          "pick_first; dns:/// targets of several replicas want round_robin).");
ABSL_FLAG(int, max_attempts, gpucompute::ClientOptions().max_attempts,
          "Attempts of an idempotent call that a replica could not answer (down or draining); "
          "1 = no retries.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60), "Deadline of each call, e.g. 30s, 500ms.");
ABSL_FLAG(absl::Duration, connect_timeout, gpucompute::ClientOptions().connect_timeout,
          "How long a call waits for a connection that is not up (at most half its --timeout) "
          "before it fails with UNAVAILABLE; 0: fail at once.");
ABSL_FLAG(bool, tls, false, "Connect with TLS.");
ABSL_FLAG(std::string, tls_ca, "", "PEM file of root certificates (default: the system's).");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate chain, for mutual TLS.");
ABSL_FLAG(std::string, tls_key, "", "PEM client private key, for mutual TLS.");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check the server certificate against instead of the host.");
ABSL_FLAG(std::string, token, "",
          "Bearer token for a server started with --token_file (sent as authorization "
          "metadata; visible in the process list: prefer --token_file).");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token (whitespace around it ignored).");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{1} << 30,
          "Largest message sent or received (the server's default is the same).");
ABSL_FLAG(std::string, session, "",
          "Owner of the resident tensors this command makes and sees (the "
          "gpucompute-session metadata); empty: the anonymous owner.");
ABSL_FLAG(int, streams, gpucompute::ClientOptions().streams,
          "Parallel streams, each on a connection of its own: of an upload or download of "
          "64 MiB or more, and the Batch streams of bench --mode=batch.");
ABSL_FLAG(int64_t, offload_min_bytes, gpucompute::ClientOptions().offload_min_bytes,
          "An operation whose inline operands reach this many bytes goes through resident "
          "tensors over parallel streams (uploaded, run, downloaded, freed); 0: always one "
          "message.");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the random inputs; 0 picks a fresh one.");
ABSL_FLAG(std::string, dtype, "float32", "Input dtype: float32, float16 or bfloat16.");
ABSL_FLAG(std::string, out_dtype, "", "Result dtype (default: the input dtype).");
ABSL_FLAG(std::string, variant, "", "Kernel variant by name (default: the fastest).");
ABSL_FLAG(std::vector<std::string>, devices, {},
          "Device indices that may run the request, e.g. 0,2 (default: all).");
ABSL_FLAG(bool, allow_tf32, false,
          "CUDA backend: fp32 GEMM/GEMV may run in TF32, fp32 attention on the flash rungs "
          "(Q, K and V rounded to bfloat16).");

namespace gpucompute::cli {

absl::StatusOr<std::unique_ptr<Client>> MakeClient() {
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  options.lb_policy = absl::GetFlag(FLAGS_lb_policy);
  options.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  options.default_timeout = absl::GetFlag(FLAGS_timeout);
  options.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.use_tls = absl::GetFlag(FLAGS_tls);
  options.root_certs_path = absl::GetFlag(FLAGS_tls_ca);
  options.client_cert_path = absl::GetFlag(FLAGS_tls_cert);
  options.client_key_path = absl::GetFlag(FLAGS_tls_key);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  options.token = absl::GetFlag(FLAGS_token);
  options.token_file = absl::GetFlag(FLAGS_token_file);
  options.session = absl::GetFlag(FLAGS_session);
  options.streams = absl::GetFlag(FLAGS_streams);
  options.offload_min_bytes = absl::GetFlag(FLAGS_offload_min_bytes);
  return Client::Create(std::move(options));
}

CallOptions MakeCallOptions() {
  CallOptions call;
  call.timeout = absl::GetFlag(FLAGS_timeout);
  return call;
}

std::mt19937_64 MakeRng(uint64_t& seed) {
  seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = std::random_device()() | (uint64_t{std::random_device()()} << 32);
  return std::mt19937_64(seed);
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text, const std::string& flag) {
  std::vector<int64_t> shape;
  if (absl::StripAsciiWhitespace(text).empty()) return shape;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d) || d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": \"", text, "\" is not a list of sizes such as 2,3,4"));
    }
    shape.push_back(d);
  }
  return shape;
}

absl::StatusOr<v1::DType> InputDType() {
  auto dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("--", dtype.status().message()));
  return dtype;
}

absl::StatusOr<v1::OpOptions> MakeOpOptions() {
  v1::OpOptions options;
  options.set_variant(absl::GetFlag(FLAGS_variant));
  for (const std::string& d : absl::GetFlag(FLAGS_devices)) {
    int index = 0;
    if (!absl::SimpleAtoi(d, &index)) {
      return absl::InvalidArgumentError(absl::StrCat("--devices: \"", d, "\" is not an index"));
    }
    options.add_devices(index);
  }
  if (!absl::GetFlag(FLAGS_out_dtype).empty()) {
    auto out = ParseDType(absl::GetFlag(FLAGS_out_dtype));
    if (!out.ok())
      return absl::InvalidArgumentError(absl::StrCat("--out_", out.status().message()));
    options.set_output_dtype(*out);
  }
  options.set_allow_tf32(absl::GetFlag(FLAGS_allow_tf32));
  return options;
}

absl::StatusOr<v1::Tensor> LoadNpyTensor(const std::string& path, v1::DType dtype) {
  auto array = ReadNpy(path);
  if (!array.ok()) return array.status();
  const std::string& descr = array->descr;
  v1::DType file_dtype = v1::DTYPE_UNSPECIFIED;
  if (descr == "<f4") file_dtype = v1::FLOAT32;
  if (descr == "<f2") file_dtype = v1::FLOAT16;
  if (descr == "<u2") file_dtype = v1::BFLOAT16;
  if (file_dtype == dtype) return MakeTensor(dtype, array->shape, std::move(array->data));

  int64_t n = static_cast<int64_t>(array->data.size()) / NpyItemSize(descr);
  std::vector<float> values(n);
  if (descr == "<f8") {
    std::vector<double> doubles(n);
    if (n > 0) std::memcpy(doubles.data(), array->data.data(), array->data.size());
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(doubles[i]);
  } else if (file_dtype != v1::DTYPE_UNSPECIFIED) {
    ToFloat(ToHostDType(file_dtype), array->data.data(), values.data(), n);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": dtype '", descr, "' is not one of <f4, <f2, <u2 (bfloat16 bits), <f8"));
  }
  return TensorFromFloats(dtype, array->shape, values);
}

absl::StatusOr<v1::Tensor> LoadOrRandom(const std::string& path, v1::DType dtype,
                                        const std::vector<int64_t>& shape, std::mt19937_64& rng) {
  if (!path.empty()) return LoadNpyTensor(path, dtype);
  if (!ElementCount(shape).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " is invalid"));
  }
  return RandomTensor(dtype, shape, rng);
}

absl::Status SaveNpyTensor(const std::string& path, const v1::Tensor& tensor) {
  NpyArray array;
  switch (tensor.dtype()) {
    case v1::FLOAT32:
      array.descr = "<f4";
      break;
    case v1::FLOAT16:
      array.descr = "<f2";
      break;
    case v1::BFLOAT16:
      array.descr = "<u2";
      break;
    default:
      return absl::InvalidArgumentError("the result has no dtype");
  }
  array.shape = ShapeOf(tensor);
  array.data = tensor.data();
  return WriteNpy(path, array);
}

v1::OpOptions* MutableOptions(v1::BatchRequest& request) {
  switch (request.op_case()) {
    case v1::BatchRequest::kGemm:
      return request.mutable_gemm()->mutable_options();
    case v1::BatchRequest::kGemv:
      return request.mutable_gemv()->mutable_options();
    case v1::BatchRequest::kReduce:
      return request.mutable_reduce()->mutable_options();
    case v1::BatchRequest::kTranspose:
      return request.mutable_transpose()->mutable_options();
    case v1::BatchRequest::kAttention:
      return request.mutable_attention()->mutable_options();
    default:
      return nullptr;
  }
}

Work WorkOfRequest(const v1::BatchRequest& request) {
  switch (request.op_case()) {
    case v1::BatchRequest::kGemm:
      return WorkOf(request.gemm());
    case v1::BatchRequest::kGemv:
      return WorkOf(request.gemv());
    case v1::BatchRequest::kReduce:
      return WorkOf(request.reduce());
    case v1::BatchRequest::kTranspose:
      return WorkOf(request.transpose());
    case v1::BatchRequest::kAttention:
      return WorkOf(request.attention());
    default:
      return {};
  }
}

int64_t RequestPayloadBytes(const v1::BatchRequest& r) {
  switch (r.op_case()) {
    case v1::BatchRequest::kGemm:
      return PayloadBytes(r.gemm().a()) + PayloadBytes(r.gemm().b()) + PayloadBytes(r.gemm().c());
    case v1::BatchRequest::kGemv:
      return PayloadBytes(r.gemv().a()) + PayloadBytes(r.gemv().x()) + PayloadBytes(r.gemv().y());
    case v1::BatchRequest::kReduce:
      return PayloadBytes(r.reduce().input());
    case v1::BatchRequest::kTranspose:
      return PayloadBytes(r.transpose().input());
    case v1::BatchRequest::kAttention:
      return PayloadBytes(r.attention().q()) + PayloadBytes(r.attention().k()) +
             PayloadBytes(r.attention().v());
    default:
      return 0;
  }
}

int64_t ResponsePayloadBytes(const v1::BatchResponse& r) {
  switch (r.result_case()) {
    case v1::BatchResponse::kGemm:
      return PayloadBytes(r.gemm().c());
    case v1::BatchResponse::kGemv:
      return PayloadBytes(r.gemv().y());
    case v1::BatchResponse::kReduce:
      return PayloadBytes(r.reduce().output());
    case v1::BatchResponse::kTranspose:
      return PayloadBytes(r.transpose().output());
    case v1::BatchResponse::kAttention:
      return PayloadBytes(r.attention().o()) + PayloadBytes(r.attention().lse());
    default:
      return 0;
  }
}

namespace {

// Stores a unary call's outcome into `out` through `mutable_result`.
template <typename Response, typename Mutable>
void Store(absl::StatusOr<Response> result, v1::BatchResponse& out, Mutable mutable_result) {
  if (!result.ok()) {
    out.set_code(static_cast<int>(result.status().code()));
    out.set_message(std::string(result.status().message()));
    return;
  }
  *(out.*mutable_result)() = *std::move(result);
}

}  // namespace

v1::BatchResponse CallUnary(const Client& client, const v1::BatchRequest& request,
                            const CallOptions& call) {
  v1::BatchResponse out;
  out.set_id(request.id());
  switch (request.op_case()) {
    case v1::BatchRequest::kGemm:
      Store(client.Gemm(request.gemm(), call), out, &v1::BatchResponse::mutable_gemm);
      break;
    case v1::BatchRequest::kGemv:
      Store(client.Gemv(request.gemv(), call), out, &v1::BatchResponse::mutable_gemv);
      break;
    case v1::BatchRequest::kReduce:
      Store(client.Reduce(request.reduce(), call), out, &v1::BatchResponse::mutable_reduce);
      break;
    case v1::BatchRequest::kTranspose:
      Store(client.Transpose(request.transpose(), call), out,
            &v1::BatchResponse::mutable_transpose);
      break;
    case v1::BatchRequest::kAttention:
      Store(client.Attention(request.attention(), call), out,
            &v1::BatchResponse::mutable_attention);
      break;
    default:
      out.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      out.set_message("request: no operation set");
  }
  return out;
}

void PrintError(const std::string& what, const absl::Status& status) {
  std::cerr << "gpucompute: " << what << ": " << absl::StatusCodeToString(status.code()) << ": "
            << status.message() << "\n";
}

}  // namespace gpucompute::cli
