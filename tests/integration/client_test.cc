// The client library against an in-process stand-in server: TLS, deadlines,
// message limits, and how Batch treats a server that answers wrongly.
#include "client/client.h"

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

// Echo (after `delay`), and Batch answered per `batch_mode`.
class StandIn final : public v1::Compute::Service {
 public:
  enum class BatchMode { kAnswerAll, kSkipLast, kUnknownId };
  std::chrono::milliseconds delay{0};
  BatchMode batch_mode = BatchMode::kAnswerAll;

  grpc::Status Echo(grpc::ServerContext* ctx, const v1::EchoRequest* request,
                    v1::EchoResponse* response) override {
    auto until = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < until && !ctx->IsCancelled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    *response->mutable_output() = request->input();
    return grpc::Status::OK;
  }

  grpc::Status Batch(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::BatchResponse, v1::BatchRequest>* stream) override {
    std::vector<std::string> ids;
    v1::BatchRequest request;
    while (stream->Read(&request)) ids.push_back(request.id());
    if (batch_mode == BatchMode::kSkipLast && !ids.empty()) ids.pop_back();
    if (batch_mode == BatchMode::kUnknownId) ids.push_back("never-sent");
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {  // in reverse order
      v1::BatchResponse response;
      response.set_id(*it);
      response.set_code(5);
      response.set_message("stand-in");
      stream->Write(response);
    }
    return grpc::Status::OK;
  }
};

// The stand-in served on an ephemeral loopback port.
struct InProcessServer {
  explicit InProcessServer(StandIn* service, std::shared_ptr<grpc::ServerCredentials> credentials =
                                                 grpc::InsecureServerCredentials()) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port);
    builder.RegisterService(service);
    server = builder.BuildAndStart();
  }
  ~InProcessServer() {
    if (server) server->Shutdown(std::chrono::system_clock::now());
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

ClientOptions Options(const std::string& target) {
  ClientOptions options;
  options.target = target;
  return options;
}

std::unique_ptr<Client> Connect(ClientOptions options) {
  auto client = Client::Create(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

TEST(ClientTest, CreateRejectsInconsistentOptions) {
  auto code = [](std::function<void(ClientOptions&)> change) {
    ClientOptions options = Options("localhost:1");
    change(options);
    return Client::Create(options).status().code();
  };
  EXPECT_EQ(code([](auto& o) { o.target = ""; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](auto& o) { o.max_message_bytes = 0; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](auto& o) { o.default_timeout = absl::ZeroDuration(); }),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](auto& o) {  // a certificate without its key
              o.use_tls = true;
              o.client_cert_path = "/x.pem";
            }),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](auto& o) { o.root_certs_path = "/x.pem"; }),  // TLS files without TLS
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](auto& o) {
              o.use_tls = true;
              o.root_certs_path = "/nonexistent/ca.pem";
            }),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(code([](auto&) {}), absl::StatusCode::kOk);
}

TEST(ClientTest, DeadlineOnEveryCall) {
  StandIn service;
  service.delay = std::chrono::milliseconds(2000);
  InProcessServer server(&service);
  ASSERT_NE(server.server, nullptr);
  ClientOptions options = Options(server.address());
  options.default_timeout = absl::Seconds(30);
  auto client = Connect(options);
  auto start = absl::Now();
  auto echo = client->Echo(MakeEcho(v1::FLOAT32, {3}), {.timeout = absl::Milliseconds(200)});
  EXPECT_EQ(echo.status().code(), absl::StatusCode::kDeadlineExceeded) << echo.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1.5));

  // The default deadline applies when the call gives none.
  options.default_timeout = absl::Milliseconds(200);
  auto short_default = Connect(options);
  auto late = short_default->Echo(MakeEcho(v1::FLOAT32, {3}));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
}

TEST(ClientTest, MessageLimit) {
  StandIn service;
  InProcessServer server(&service);
  ClientOptions options = Options(server.address());
  options.max_message_bytes = 4096;
  auto client = Connect(options);
  auto small = client->Echo(MakeEcho(v1::FLOAT32, {100}));
  EXPECT_TRUE(small.ok()) << small.status();
  auto big = client->Echo(MakeEcho(v1::FLOAT32, {2000}));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
}

TEST(ClientTest, BatchCollectsOutOfOrderAnswersById) {
  StandIn service;
  InProcessServer server(&service);
  auto client = Connect(Options(server.address()));
  std::vector<v1::BatchRequest> requests(5);
  for (size_t i = 0; i < requests.size(); ++i) requests[i].set_id(absl::StrCat("r", i));
  auto items = client->Batch(requests);
  ASSERT_TRUE(items.ok()) << items.status();
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*items)[i].response.id(), requests[i].id());
    EXPECT_EQ((*items)[i].response.code(), 5);
  }
}

TEST(ClientTest, BatchNoticesMissingAndUnknownAnswers) {
  StandIn service;
  InProcessServer server(&service);
  auto client = Connect(Options(server.address()));
  std::vector<v1::BatchRequest> requests(3);
  for (size_t i = 0; i < requests.size(); ++i) requests[i].set_id(absl::StrCat("r", i));

  service.batch_mode = StandIn::BatchMode::kSkipLast;
  auto missing = client->Batch(requests);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInternal) << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "r2")) << missing.status();

  service.batch_mode = StandIn::BatchMode::kUnknownId;
  auto unknown = client->Batch(requests);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInternal) << unknown.status();
  EXPECT_TRUE(absl::StrContains(unknown.status().message(), "never-sent")) << unknown.status();
}

// A TLS server with a self-signed certificate made by openssl.
TEST(ClientTest, TlsWithRootCertificate) {
  TempDir dir;
  CommandResult openssl =
      RunCommand({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                  "-subj", "/CN=gpucompute.test", "-addext", "subjectAltName=DNS:gpucompute.test",
                  "-keyout", dir.File("key.pem"), "-out", dir.File("cert.pem")});
  if (openssl.exit_code != 0) GTEST_SKIP() << "openssl could not make a certificate";
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({read(dir.File("key.pem")), read(dir.File("cert.pem"))});
  StandIn service;
  InProcessServer server(&service, grpc::SslServerCredentials(ssl));
  ASSERT_NE(server.server, nullptr);

  ClientOptions options = Options(server.address());
  options.use_tls = true;
  options.root_certs_path = dir.File("cert.pem");
  options.tls_server_name = "gpucompute.test";
  auto tls = Connect(options);
  v1::EchoRequest request = MakeEcho(v1::BFLOAT16, {7, 5});
  auto echo = tls->Echo(request, {.timeout = absl::Seconds(10)});
  ASSERT_TRUE(echo.ok()) << echo.status();
  EXPECT_EQ(echo->output().data(), request.input().data());

  // Without TLS the server cannot be reached.
  auto plain = Connect(Options(server.address()));
  EXPECT_EQ(plain->Echo(request, {.timeout = absl::Seconds(5)}).status().code(),
            absl::StatusCode::kUnavailable);

  // The CLI takes the same options.
  CommandResult cli = RunCommand(
      {CliPath(), "echo", "--shape=33", "--check", "--tls", "--tls_ca=" + dir.File("cert.pem"),
       "--tls_server_name=gpucompute.test", "--server=" + server.address()});
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
}

TEST(ClientTest, TensorHelpers) {
  EXPECT_EQ(ElementCount({}).value(), 1);
  EXPECT_EQ(ElementCount({0, 5}).value(), 0);
  EXPECT_EQ(ElementCount({3, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ElementCount({int64_t{1} << 40, int64_t{1} << 40}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDType("bf16").value(), v1::BFLOAT16);
  EXPECT_EQ(ParseDType("Float16").value(), v1::FLOAT16);
  EXPECT_FALSE(ParseDType("int8").ok());
  v1::Tensor t = MakeFloat32Tensor({2, 2}, {1, 2, 3, 4});
  EXPECT_TRUE(CheckTensor(t, "t").ok());
  t.mutable_data()->pop_back();
  EXPECT_TRUE(absl::StrContains(CheckTensor(t, "t").message(), "t.data"));
  t.set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_TRUE(absl::StrContains(CheckTensor(t, "t").message(), "t.dtype"));
}

}  // namespace
}  // namespace gpucompute::testing
