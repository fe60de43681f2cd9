// The server's host memory under load (issue 15): Echo counts against
// --max_inflight_bytes like the operations, a request that declares a size
// it can never be served at is refused before its bytes are sent, the
// server's resident memory stays within the limit plus a fixed overhead, and
// freed memory beyond --retain_host_memory_bytes goes back to the system.
// Resident memory is read from /proc/<pid>/status (VmRSS, and VmHWM: the
// most the server ever had resident).
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gpucompute/v1/compute.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// A field of /proc/<pid>/status in bytes ("VmRSS", "VmHWM"); -1 if unreadable.
int64_t StatusBytes(pid_t pid, absl::string_view field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, absl::StrCat(field, ":"))) continue;
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    int64_t kb = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) return kb * 1024;
  }
  return -1;
}

// The value of an unlabelled metric; -1 when /metrics cannot be read.
double Metric(const ServerProcess& server, absl::string_view name) {
  absl::StatusOr<std::string> text = HttpGet(server.metrics_port(), "/metrics");
  if (!text.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::StartsWith(line, absl::StrCat(name, " "))) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(name.size() + 1), &value)) return value;
  }
  return -1;
}

// An Echo of `bytes` of float32 zeros.
v1::EchoRequest ZerosEcho(int64_t bytes) {
  v1::EchoRequest request;
  request.mutable_input()->set_dtype(v1::FLOAT32);
  request.mutable_input()->add_shape(bytes / 4);
  request.mutable_input()->mutable_data()->assign(static_cast<size_t>(bytes), '\0');
  return request;
}

std::unique_ptr<ServerProcess> StartServer(const std::vector<std::string>& args) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(args);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Calls Echo with `request` from `calls` threads at once; returns each
// call's status.
std::vector<absl::Status> ConcurrentEchos(const ServerProcess& server,
                                          const v1::EchoRequest& request, int calls) {
  std::unique_ptr<Client> client = server.NewClient(absl::Seconds(120));
  std::vector<absl::Status> statuses(calls);
  std::vector<std::thread> threads;
  for (int i = 0; i < calls; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<v1::EchoResponse> echoed = client->Echo(request);
      statuses[i] = echoed.status();
      if (echoed.ok() && echoed->output().data().size() != request.input().data().size()) {
        statuses[i] = absl::DataLossError("the echo came back with another size");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

// --max_inflight_bytes bounds Echo too: six concurrent Echos of 24 MiB (each
// holds 48 MiB: the request as received and decoded, then the answer and
// its encoding) are served one at a time under a 64 MiB limit, and the
// server's resident memory never passes its start plus the limit plus
// 48 MiB (gRPC's buffers, the allocator's slack); an Echo that can never
// fit is refused at once, naming the flag, without being received.
TEST(MemoryTest, EchoIsAdmittedUnderTheInflightLimit) {
  constexpr int64_t kLimit = 64 * kMiB;
  std::unique_ptr<ServerProcess> server =
      StartServer({absl::StrCat("--max_inflight_bytes=", kLimit)});
  ASSERT_NE(server, nullptr);
  const int64_t start_rss = StatusBytes(server->pid(), "VmRSS");
  ASSERT_GT(start_rss, 0);

  std::unique_ptr<Client> client = server->NewClient(absl::Seconds(60));
  const double received_before = Metric(*server, "gpucompute_received_bytes_total");
  absl::StatusOr<v1::EchoResponse> too_large = client->Echo(ZerosEcho(40 * kMiB));
  EXPECT_EQ(too_large.status().code(), absl::StatusCode::kResourceExhausted) << too_large.status();
  EXPECT_TRUE(absl::StrContains(too_large.status().message(), "--max_inflight_bytes"))
      << too_large.status();
  EXPECT_LT(Metric(*server, "gpucompute_received_bytes_total") - received_before, 1.0 * kMiB)
      << "the refused Echo was received";

  const std::vector<absl::Status> statuses = ConcurrentEchos(*server, ZerosEcho(24 * kMiB), 6);
  for (const absl::Status& status : statuses) EXPECT_TRUE(status.ok()) << status;
  const int64_t peak = StatusBytes(server->pid(), "VmHWM");
  std::cerr << "resident at start " << start_rss / kMiB << " MiB, at most " << peak / kMiB
            << " MiB\n";
  EXPECT_LT(peak, start_rss + kLimit + 48 * kMiB)
      << "resident memory passed the limit plus the overhead";
  EXPECT_EQ(Metric(*server, "gpucompute_inflight_bytes"), 0);
}

// A request larger than --max_message_bytes that says so in its
// gpucompute-request-bytes metadata (as the C++ and Python clients do) is
// refused before it is received: the server's resident memory does not grow
// by its size (gRPC alone would read the whole message before refusing it).
TEST(MemoryTest, ARequestDeclaredOverTheMessageLimitIsRefusedBeforeItIsReceived) {
  constexpr int64_t kMaxMessage = 64 * kMiB;
  std::unique_ptr<ServerProcess> server =
      StartServer({absl::StrCat("--max_message_bytes=", kMaxMessage)});
  ASSERT_NE(server, nullptr);
  const int64_t start_rss = StatusBytes(server->pid(), "VmRSS");
  std::unique_ptr<Client> client = server->NewClient(absl::Seconds(60));
  absl::StatusOr<v1::EchoResponse> refused = client->Echo(ZerosEcho(96 * kMiB));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--max_message_bytes"))
      << refused.status();
  const int64_t peak = StatusBytes(server->pid(), "VmHWM");
  std::cerr << "resident at start " << start_rss / kMiB << " MiB, at most " << peak / kMiB
            << " MiB\n";
  EXPECT_LT(peak, start_rss + 32 * kMiB) << "the refused request was buffered";

  // The metadata is checked against what arrives: a request larger than it
  // declared is refused.
  auto stub = v1::Compute::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  context.AddMetadata("gpucompute-request-bytes", "10");
  v1::EchoResponse response;
  const grpc::Status status = stub->Echo(&context, ZerosEcho(4096), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "gpucompute-request-bytes"))
      << status.error_message();
}

// With --retain_host_memory_bytes=0 the memory freed after a burst of large
// Echos goes back to the system: the idle server's resident memory returns
// to near where it started (it stayed at 2 GB and more before).
TEST(MemoryTest, IdleMemoryReturnsWithinTheRetention) {
  std::unique_ptr<ServerProcess> server = StartServer({"--retain_host_memory_bytes=0"});
  ASSERT_NE(server, nullptr);
  const int64_t start_rss = StatusBytes(server->pid(), "VmRSS");
  for (int burst = 0; burst < 2; ++burst) {
    for (const absl::Status& status : ConcurrentEchos(*server, ZerosEcho(32 * kMiB), 4)) {
      EXPECT_TRUE(status.ok()) << status;
    }
  }
  const int64_t after = StatusBytes(server->pid(), "VmRSS");
  // The trimmer looks every second.
  int64_t idle = after;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(250));
    idle = StatusBytes(server->pid(), "VmRSS");
    if (idle < start_rss + 48 * kMiB) break;
  }
  std::cerr << "resident at start " << start_rss / kMiB << " MiB, after the bursts " << after / kMiB
            << " MiB, idle " << idle / kMiB << " MiB, at most "
            << StatusBytes(server->pid(), "VmHWM") / kMiB << " MiB\n";
  EXPECT_LT(idle, start_rss + 48 * kMiB) << "freed memory stayed resident";
}

}  // namespace
}  // namespace gpucompute::testing
