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
#include "proto/host_memory.h"
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
  // The server is built as this test is; a sanitizer's allocator keeps
  // freed memory of its own (quarantine), past the overhead glibc's has.
  if (kGlibcMalloc) {
    EXPECT_LT(peak, start_rss + kLimit + 48 * kMiB)
        << "resident memory passed the limit plus the overhead";
  }
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

// A label-matching metric's value; -1 when /metrics cannot be read.
double MetricWith(const ServerProcess& server, absl::string_view name, absl::string_view labels) {
  absl::StatusOr<std::string> text = HttpGet(server.metrics_port(), "/metrics");
  if (!text.ok()) return -1;
  double total = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::StartsWith(line, absl::StrCat(name, "{")) || !absl::StrContains(line, labels)) {
      continue;
    }
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) total += value;
  }
  return total;
}

// Batch answers count against --max_inflight_bytes until they are written,
// across streams: four streams of eight 8 MiB transposes each whose client
// reads nothing for a while. The server computes what fits under a 64 MiB
// limit (an item holds 16 MiB: its request received and decoded, then its
// result beside its encoding; its answer 8 MiB until written), then waits;
// its resident memory stays within its start plus the limit plus one item
// per stream (read before it is admitted) plus 48 MiB. Before, each stream
// held up to the limit's worth of answers, whatever the others held. Once
// the client reads, every item is answered. The server runs one allocator
// heap (--host_memory_arenas=1): with several, each keeps freed 8 MiB blocks
// that threads of the others do not reuse (+42 MiB here with 8), which is
// the allocator's retention (--retain_host_memory_bytes), not admission's.
TEST(MemoryTest, BatchAnswersAcrossStreamsStayUnderTheInflightLimit) {
  constexpr int64_t kLimit = 64 * kMiB;
  constexpr int kStreams = 4;
  constexpr int kItemsPerStream = 8;
  constexpr int64_t kItemBytes = 8 * kMiB;
  std::unique_ptr<ServerProcess> server =
      StartServer({absl::StrCat("--max_inflight_bytes=", kLimit), "--host_memory_arenas=1"});
  ASSERT_NE(server, nullptr);
  const int64_t start_rss = StatusBytes(server->pid(), "VmRSS");
  v1::BatchRequest item;
  v1::TransposeRequest* t = item.mutable_transpose();
  t->mutable_input()->set_dtype(v1::FLOAT32);
  t->mutable_input()->add_shape(2048);
  t->mutable_input()->add_shape(1024);
  t->mutable_input()->mutable_data()->assign(kItemBytes, '\1');

  struct Stream {
    std::unique_ptr<v1::Compute::Stub> stub;
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::BatchRequest, v1::BatchResponse>> rw;
    int answered_ok = 0;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Stream>> streams;
  for (int s = 0; s < kStreams; ++s) {
    auto stream = std::make_unique<Stream>();
    grpc::ChannelArguments args;
    args.SetInt("gc.stream", s);  // a connection of its own
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    stream->stub = v1::Compute::NewStub(
        grpc::CreateCustomChannel(server->address(), grpc::InsecureChannelCredentials(), args));
    stream->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stream->rw = stream->stub->Batch(&stream->context);
    streams.push_back(std::move(stream));
  }
  std::vector<std::thread> writers;
  for (int s = 0; s < kStreams; ++s) {
    writers.emplace_back([&, s] {
      v1::BatchRequest request = item;
      for (int i = 0; i < kItemsPerStream; ++i) {
        request.set_id(absl::StrCat(s, "-", i));
        if (!streams[s]->rw->Write(request)) return;
      }
      streams[s]->rw->WritesDone();
    });
  }
  // Unread, the answers pile up until the server stops computing.
  double computed = 0;
  for (absl::Time still_since = absl::Now(), until = absl::Now() + absl::Seconds(20);
       absl::Now() < until && absl::Now() - still_since < absl::Seconds(1);) {
    absl::SleepFor(absl::Milliseconds(100));
    const double now = MetricWith(*server, "gpucompute_requests_total", "Batch/Transpose");
    if (now != computed) still_since = absl::Now();
    computed = now;
  }
  const int64_t peak = StatusBytes(server->pid(), "VmHWM");
  std::vector<std::thread> readers;
  for (int s = 0; s < kStreams; ++s) {
    readers.emplace_back([&, s] {
      v1::BatchResponse answer;
      while (streams[s]->rw->Read(&answer)) {
        if (answer.code() == 0 && answer.transpose().output().data().size() == kItemBytes) {
          ++streams[s]->answered_ok;
        }
      }
    });
  }
  for (std::thread& w : writers) w.join();
  for (std::thread& r : readers) r.join();
  for (auto& stream : streams) {
    const grpc::Status status = stream->rw->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(stream->answered_ok, kItemsPerStream);
  }
  std::cerr << "resident at start " << start_rss / kMiB << " MiB, at most " << peak / kMiB
            << " MiB with " << computed << " items computed and unread\n";
  if (kGlibcMalloc) {  // as in EchoIsAdmittedUnderTheInflightLimit
    EXPECT_LT(peak, start_rss + kLimit + kStreams * kItemBytes + 48 * kMiB)
        << "resident memory passed the limit plus the overhead";
  }
}

// With --retain_host_memory_bytes=0 the memory freed after a burst of large
// Echos goes back to the system: the idle server's resident memory returns
// to near where it started (it stayed at 2 GB and more before).
TEST(MemoryTest, IdleMemoryReturnsWithinTheRetention) {
  if (!kGlibcMalloc) GTEST_SKIP() << "a sanitizer's allocator does not give memory back so";
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
