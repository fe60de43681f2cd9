// Request bodies that are not protobuf at all (an unterminated field tag, a
// length-delimited field that runs past the end, a field of wire type 7),
// sent raw through a generic stub to every method of the Compute service:
// each answers INVALID_ARGUMENT naming the request it could not parse (a
// Batch item is answered so inside its stream), counts the call in
// gpucompute_requests_total under its method, and the server keeps serving
// with nothing left behind.
#include <chrono>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gpucompute/v1/compute.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

// How a method's messages flow.
enum class Kind { kUnary, kClientStream, kServerStream, kBidiStream };

struct Method {
  std::string name;  // of the Compute service, e.g. "Gemm"
  Kind kind;
  std::string request_type;  // the message its request must be
};

const std::vector<Method>& Methods() {
  static const auto* methods = new std::vector<Method>{
      {"Gemm", Kind::kUnary, "gpucompute.v1.GemmRequest"},
      {"Gemv", Kind::kUnary, "gpucompute.v1.GemvRequest"},
      {"Reduce", Kind::kUnary, "gpucompute.v1.ReduceRequest"},
      {"Transpose", Kind::kUnary, "gpucompute.v1.TransposeRequest"},
      {"Attention", Kind::kUnary, "gpucompute.v1.AttentionRequest"},
      {"Echo", Kind::kUnary, "gpucompute.v1.EchoRequest"},
      {"GetServerInfo", Kind::kUnary, "gpucompute.v1.ServerInfoRequest"},
      {"Batch", Kind::kBidiStream, "gpucompute.v1.BatchRequest"},
      {"Upload", Kind::kClientStream, "gpucompute.v1.UploadRequest"},
      {"Download", Kind::kServerStream, "gpucompute.v1.DownloadRequest"},
      {"Free", Kind::kUnary, "gpucompute.v1.FreeRequest"},
      {"ListTensors", Kind::kUnary, "gpucompute.v1.ListTensorsRequest"},
  };
  return *methods;
}

// Bytes no protobuf parser accepts, for any message type.
struct Body {
  std::string name;
  std::string bytes;
};

const std::vector<Body>& Bodies() {
  static const auto* bodies = new std::vector<Body>{
      {"UnterminatedTag", std::string("\xff\xff\xff\xff", 4)},
      {"TruncatedLengthDelimited", std::string("\x0a\x10"
                                               "abc",
                                               5)},
      {"WireType7", std::string("\x0f", 1)},
  };
  return *bodies;
}

// For test names and failure messages.
void PrintTo(const Method& method, std::ostream* os) { *os << method.name; }
void PrintTo(const Body& body, std::ostream* os) { *os << body.name; }

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string String(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// What a call came back with.
struct Outcome {
  grpc::Status status;
  std::vector<grpc::ByteBuffer> responses;
};

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
}

// A unary call of `path` with `body` as its request.
Outcome CallUnary(grpc::GenericStub& stub, const std::string& path, const std::string& body) {
  grpc::ClientContext context;
  SetDeadline(&context);
  const grpc::ByteBuffer request = Buffer(body);
  grpc::ByteBuffer response;
  Outcome outcome;
  absl::Notification done;
  stub.UnaryCall(&context, path, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status status) {
                   outcome.status = std::move(status);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (outcome.status.ok()) outcome.responses.push_back(response);
  return outcome;
}

// A stream (any kind: on the wire they are all the same) of `path`: sends
// `messages` then half-closes, reading every answer until the status.
class Stream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static Outcome Run(grpc::GenericStub& stub, const std::string& path,
                     const std::vector<std::string>& messages) {
    Stream stream(messages);
    SetDeadline(&stream.context_);
    stub.PrepareBidiStreamingCall(&stream.context_, path, grpc::StubOptions(), &stream);
    stream.StartRead(&stream.incoming_);
    stream.WriteNext();
    stream.StartCall();
    stream.done_.WaitForNotification();
    return std::move(stream.outcome_);
  }

  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();  // else the stream is over; OnDone tells how
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    outcome_.responses.push_back(incoming_);
    incoming_.Clear();
    StartRead(&incoming_);
  }
  void OnDone(const grpc::Status& status) override {
    outcome_.status = status;
    done_.Notify();
  }

 private:
  explicit Stream(std::vector<std::string> messages) : messages_(std::move(messages)) {}

  void WriteNext() {
    if (next_ == messages_.size()) {
      StartWritesDone();
      return;
    }
    outgoing_ = Buffer(messages_[next_++]);
    StartWrite(&outgoing_);
  }

  const std::vector<std::string> messages_;
  size_t next_ = 0;
  grpc::ClientContext context_;
  grpc::ByteBuffer outgoing_, incoming_;
  Outcome outcome_;
  absl::Notification done_;
};

// One server for a suite, called through a generic stub.
class MalformedBase : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = ServerProcess::Start({"--cpu_devices=2"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server).release();
    stub_ = new grpc::GenericStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  static void TearDownTestSuite() {
    delete stub_;
    stub_ = nullptr;
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  // gpucompute_requests_total of `method` with code INVALID_ARGUMENT.
  static double Invalid(const std::string& method) {
    absl::StatusOr<std::string> text = HttpGet(server_->metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    if (!text.ok()) return -1;
    return MetricSum(*text, "gpucompute_requests_total",
                     {absl::StrCat("method=\"", method, "\""), "code=\"INVALID_ARGUMENT\""});
  }

  // Waits up to 10 s for Invalid(method) to reach `expected` (a stream is
  // counted once gRPC is done with it, a little after its status is sent).
  static double AwaitInvalid(const std::string& method, double expected) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    double count = Invalid(method);
    while (count < expected && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      count = Invalid(method);
    }
    return count;
  }

  static ServerProcess* server_;
  static grpc::GenericStub* stub_;
};

ServerProcess* MalformedBase::server_ = nullptr;
grpc::GenericStub* MalformedBase::stub_ = nullptr;

class MalformedTest : public MalformedBase,
                      public ::testing::WithParamInterface<std::tuple<Method, Body>> {};
class MalformedUnaryTest : public MalformedBase {};

TEST_P(MalformedTest, InvalidArgumentNamingTheRequestAndCounted) {
  const auto& [method, body] = GetParam();
  const std::string path = absl::StrCat("/gpucompute.v1.Compute/", method.name);
  // A Batch stream answers each item, with its own code, counted as
  // "Batch/<Op>" ("Batch/Invalid": an item that could not be decoded).
  const std::string counted = method.kind == Kind::kBidiStream ? "Batch/Invalid" : method.name;
  const double before = Invalid(counted);

  const Outcome outcome = method.kind == Kind::kUnary ? CallUnary(*stub_, path, body.bytes)
                                                      : Stream::Run(*stub_, path, {body.bytes});
  grpc::StatusCode code = outcome.status.error_code();
  std::string message = outcome.status.error_message();
  if (method.kind == Kind::kBidiStream) {
    EXPECT_TRUE(outcome.status.ok())
        << outcome.status.error_code() << ": " << outcome.status.error_message();
    ASSERT_EQ(outcome.responses.size(), 1u);
    v1::BatchResponse answer;
    ASSERT_TRUE(answer.ParseFromString(String(outcome.responses.front())));
    code = static_cast<grpc::StatusCode>(answer.code());
    message = answer.message();
  } else {
    EXPECT_TRUE(outcome.responses.empty());
  }
  EXPECT_EQ(code, grpc::StatusCode::INVALID_ARGUMENT) << "message: \"" << message << "\"";
  EXPECT_NE(code, grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(code, grpc::StatusCode::INTERNAL);
  EXPECT_FALSE(message.empty());
  EXPECT_TRUE(absl::StrContains(message, "request")) << message;
  EXPECT_TRUE(absl::StrContains(message, method.request_type)) << message;

  EXPECT_EQ(AwaitInvalid(counted, before + 1), before + 1)
      << "gpucompute_requests_total{method=\"" << counted
      << "\",code=\"INVALID_ARGUMENT\"} did not count the call";
}

INSTANTIATE_TEST_SUITE_P(MalformedBodies, MalformedTest,
                         ::testing::Combine(::testing::ValuesIn(Methods()),
                                            ::testing::ValuesIn(Bodies())),
                         [](const ::testing::TestParamInfo<std::tuple<Method, Body>>& info) {
                           return absl::StrCat(std::get<0>(info.param).name, "_",
                                               std::get<1>(info.param).name);
                         });

// A unary method called without any request message (a stream half-closed
// at once) is answered INVALID_ARGUMENT too, and counted.
TEST_F(MalformedUnaryTest, WithoutARequestMessage) {
  for (const Method& method : Methods()) {
    if (method.kind != Kind::kUnary) continue;
    SCOPED_TRACE(method.name);
    const double before = Invalid(method.name);
    const Outcome outcome =
        Stream::Run(*stub_, absl::StrCat("/gpucompute.v1.Compute/", method.name), {});
    EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << outcome.status.error_message();
    EXPECT_TRUE(absl::StrContains(outcome.status.error_message(), "request message"))
        << outcome.status.error_message();
    EXPECT_EQ(AwaitInvalid(method.name, before + 1), before + 1);
  }
}

// After malformed bodies to every method (and the health service's), the
// server serves as before and holds nothing for anyone.
TEST(MalformedServerTest, KeepsServingAndHoldsNothing) {
  auto server = ServerProcess::Start({"--cpu_devices=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  grpc::GenericStub stub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  for (int round = 0; round < 3; ++round) {
    for (const Method& method : Methods()) {
      for (const Body& body : Bodies()) {
        const std::string path = absl::StrCat("/gpucompute.v1.Compute/", method.name);
        const Outcome outcome = method.kind == Kind::kUnary
                                    ? CallUnary(stub, path, body.bytes)
                                    : Stream::Run(stub, path, {body.bytes, body.bytes});
        EXPECT_NE(outcome.status.error_code(), grpc::StatusCode::UNAVAILABLE)
            << method.name << " " << body.name << ": " << outcome.status.error_message();
      }
    }
  }
  // The health service is gRPC's own: it names what it could not parse too.
  for (const Body& body : Bodies()) {
    const Outcome health = CallUnary(stub, "/grpc.health.v1.Health/Check", body.bytes);
    EXPECT_EQ(health.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << body.name;
    EXPECT_FALSE(health.status.error_message().empty()) << body.name;
  }

  auto client = (*server)->NewClient(absl::Seconds(20));
  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GE(info->devices_size(), 1);
  auto list = client->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->tensors_size(), 0);
  EXPECT_EQ(list->used_bytes(), 0);

  auto metrics = HttpGet((*server)->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(MetricSum(*metrics, "gpucompute_requests_total", {"code=\"UNIMPLEMENTED\""}), 0);
  EXPECT_EQ(MetricSum(*metrics, "gpucompute_requests_total", {"code=\"INTERNAL\""}), 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  double inflight = -1;
  while (absl::Now() < deadline) {
    metrics = HttpGet((*server)->metrics_port(), "/metrics");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    inflight = MetricSum(*metrics, "gpucompute_inflight_requests", {}) +
               MetricSum(*metrics, "gpucompute_inflight_bytes", {}) +
               MetricSum(*metrics, "gpucompute_queue_depth", {});
    if (inflight == 0) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(inflight, 0) << "requests, bytes or queued operations left in flight";
}

}  // namespace
}  // namespace gpucompute::testing
