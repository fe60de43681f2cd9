// grpc.health.v1 Check and Watch, and server reflection, on the real server.
#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "client/client.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
namespace reflection = grpc::reflection::v1alpha;

void SetDeadline(grpc::ClientContext& ctx, int seconds) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

class HealthReflectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = ServerProcess::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = server_->NewClient(absl::Seconds(10));
  }
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(HealthReflectionTest, CheckReportsServing) {
  EXPECT_EQ(client_->Health("").value_or(HealthCheckResponse::UNKNOWN),
            HealthCheckResponse::SERVING);
  EXPECT_EQ(client_->Health("gpucompute.v1.Compute").value_or(HealthCheckResponse::UNKNOWN),
            HealthCheckResponse::SERVING);
  auto unknown = client_->Health("no.such.Service");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
}

TEST_F(HealthReflectionTest, WatchStartsWithServing) {
  auto stub = grpc::health::v1::Health::NewStub(client_->channel());
  for (const std::string service : {"", "gpucompute.v1.Compute"}) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, 10);
    HealthCheckRequest request;
    request.set_service(service);
    auto reader = stub->Watch(&ctx, request);
    HealthCheckResponse response;
    ASSERT_TRUE(reader->Read(&response)) << "service \"" << service << "\"";
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
    ctx.TryCancel();
    reader->Finish();
  }
  // An unknown service is watched as SERVICE_UNKNOWN.
  grpc::ClientContext ctx;
  SetDeadline(ctx, 10);
  HealthCheckRequest request;
  request.set_service("no.such.Service");
  auto reader = stub->Watch(&ctx, request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  ctx.TryCancel();
  reader->Finish();
}

TEST_F(HealthReflectionTest, ReflectionListsTheComputeService) {
  auto stub = reflection::ServerReflection::NewStub(client_->channel());
  grpc::ClientContext ctx;
  SetDeadline(ctx, 10);
  auto stream = stub->ServerReflectionInfo(&ctx);

  reflection::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  reflection::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_TRUE(response.has_list_services_response()) << response.DebugString();
  std::set<std::string> services;
  for (const auto& s : response.list_services_response().service()) services.insert(s.name());
  EXPECT_TRUE(services.count("gpucompute.v1.Compute")) << response.DebugString();
  EXPECT_TRUE(services.count("grpc.health.v1.Health")) << response.DebugString();

  // The file that defines the service describes every RPC.
  reflection::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("gpucompute.v1.Compute");
  ASSERT_TRUE(stream->Write(symbol));
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_TRUE(response.has_file_descriptor_response()) << response.DebugString();
  bool found = false;
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(bytes));
    if (file.package() != "gpucompute.v1") continue;
    for (const auto& service : file.service()) {
      if (service.name() != "Compute") continue;
      found = true;
      std::set<std::string> methods;
      for (const auto& m : service.method()) methods.insert(m.name());
      EXPECT_EQ(methods, (std::set<std::string>{"Gemm", "Gemv", "Reduce", "Transpose", "Attention",
                                                "Echo", "GetServerInfo", "Batch", "Upload",
                                                "Download", "Free", "ListTensors"}));
    }
  }
  EXPECT_TRUE(found) << "no gpucompute.v1.Compute in the reflected files";
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace gpucompute::testing
