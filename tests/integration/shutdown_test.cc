// SIGTERM with requests in flight: every one is answered OK, new calls are
// refused (UNAVAILABLE, never CANCELLED), health turns NOT_SERVING and every
// Watch is told so and closed, and the server exits 0 (at once when idle,
// whatever Watches are open).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "client/verify.h"
#include "gpucompute/v1/compute.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

using grpc::health::v1::HealthCheckResponse;

// gpucompute_inflight_requests from /metrics; -1 when it cannot be read.
double InflightRequests(int metrics_port) {
  auto text = HttpGet(metrics_port, "/metrics");
  if (!text.ok()) return -1;
  double total = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::StartsWith(line, "gpucompute_inflight_requests")) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) total += v;
  }
  return total;
}

TEST(ShutdownTest, SigtermDrainsRequestsInFlight) {
  // Needs one slow device and one worker so that requests are in flight.
  GC_SKIP_IF_DEVICES_OVERRIDDEN();
  constexpr int kInFlight = 4;
  // One worker thread: the requests run one after another, so that all of
  // them are in flight (one computing, the rest queued) when SIGTERM comes.
  auto server = ServerProcess::Start({"--cpu_devices=1", "--worker_threads=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(120));

  // An attention request that takes at least 250 ms of server time here,
  // and its answer before any shutdown (the drained answers must equal it).
  // It grows along seq_q first: the work doubles while the bytes on the
  // wire stay small, so that the requests arrive long before the first one
  // is done, even on a slow two-core machine.
  AttentionCase size{
      .batch = 1, .heads_q = 4, .heads_kv = 4, .seq_q = 256, .seq_kv = 1024, .head_dim = 128};
  v1::AttentionRequest request;
  absl::StatusOr<v1::AttentionResponse> baseline;
  while (true) {
    request = MakeAttention(v1::BFLOAT16, size);
    baseline = client->Attention(request);
    ASSERT_TRUE(baseline.ok()) << baseline.status();
    if (baseline->timings().server_seconds() >= 0.25 || size.seq_kv >= 65536) break;
    if (size.seq_q < 8192) {
      size.seq_q *= 2;
    } else {
      size.seq_kv *= 2;
    }
  }
  // A health watcher that records every state it is told.
  std::vector<int> states;
  std::atomic<bool> watching{false};
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto health = grpc::health::v1::Health::NewStub(client->channel());
  grpc::health::v1::HealthCheckRequest watch_request;
  std::thread watcher([&] {
    auto reader = health->Watch(&watch_ctx, watch_request);
    HealthCheckResponse r;
    while (reader->Read(&r)) {
      states.push_back(r.status());
      watching = true;
      // Done once told NOT_SERVING (an open watch would hold the drain).
      if (r.status() == HealthCheckResponse::NOT_SERVING) watch_ctx.TryCancel();
    }
    reader->Finish();
  });

  for (absl::Time until = absl::Now() + absl::Seconds(10); !watching && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }

  std::vector<v1::AttentionRequest> requests(kInFlight, request);
  std::vector<absl::StatusOr<v1::AttentionResponse>> responses(kInFlight);
  std::vector<std::thread> threads;
  for (int i = 0; i < kInFlight; ++i) {
    threads.emplace_back([&, i] { responses[i] = client->Attention(requests[i]); });
  }

  // SIGTERM once every request is being served. (No ASSERT until the
  // threads are joined.)
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  bool all_in_flight = false;
  double most = 0;
  while (!all_in_flight && absl::Now() < deadline) {
    most = std::max(most, InflightRequests((*server)->metrics_port()));
    all_in_flight = most >= kInFlight;
    if (!all_in_flight) absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_TRUE(all_in_flight) << "the requests never were in flight together (at most " << most
                             << "; seq_q " << size.seq_q << ", seq_kv " << size.seq_kv << ")";
  (*server)->Signal(SIGTERM);

  // New calls are refused while draining (or once stopped).
  absl::SleepFor(absl::Milliseconds(50));
  auto late = (*server)
                  ->NewClient(absl::Seconds(10), /*own_connection=*/true)
                  ->Echo(MakeEcho(v1::FLOAT32, {3}));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable) << late.status();

  for (std::thread& t : threads) t.join();
  auto status = (*server)->Wait(absl::Seconds(60));
  watch_ctx.TryCancel();
  watcher.join();

  for (int i = 0; i < kInFlight; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(responses[i].ok()) << responses[i].status();
    EXPECT_EQ(responses[i]->o().data(), baseline->o().data());
  }
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << (*server)->Log();
  EXPECT_TRUE(WIFEXITED(*status)) << "killed by signal " << WTERMSIG(*status);
  EXPECT_EQ(WEXITSTATUS(*status), 0) << (*server)->Log();
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.front(), HealthCheckResponse::SERVING);
  EXPECT_EQ(states.back(), HealthCheckResponse::NOT_SERVING)
      << "the watch was not told NOT_SERVING while draining";
}

TEST(ShutdownTest, HealthWatchIsToldAndClosedAndDoesNotHoldShutdown) {
  // A client with client-side health checking always holds a Watch: an idle
  // server must still exit at once, well within the shutdown timeout.
  auto server = ServerProcess::Start({"--shutdown_timeout=30s"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(60));
  auto health = grpc::health::v1::Health::NewStub(client->channel());
  std::vector<int> states;
  std::atomic<bool> watching{false};
  std::atomic<bool> closed{false};
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  std::thread watcher([&] {
    auto reader = health->Watch(&watch_ctx, grpc::health::v1::HealthCheckRequest());
    HealthCheckResponse r;
    while (reader->Read(&r)) {
      states.push_back(r.status());
      watching = true;
    }
    reader->Finish();
    closed = true;
  });
  for (absl::Time until = absl::Now() + absl::Seconds(10); !watching && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_TRUE(watching) << "the watch never answered";

  const absl::Time signalled = absl::Now();
  (*server)->Signal(SIGTERM);
  auto status = (*server)->Wait(absl::Seconds(10));
  const absl::Duration took = absl::Now() - signalled;
  // The server closes the watch (or its exit does); either way it ends.
  for (absl::Time until = absl::Now() + absl::Seconds(5); !closed && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  watch_ctx.TryCancel();
  watcher.join();

  ASSERT_TRUE(status.ok()) << "still running 10 s after SIGTERM with a health Watch open: "
                           << status.status();
  EXPECT_LT(took, absl::Seconds(3)) << "an idle server took " << took << " to exit";
  EXPECT_TRUE(WIFEXITED(*status)) << "killed by signal " << WTERMSIG(*status);
  EXPECT_EQ(WEXITSTATUS(*status), 0) << (*server)->Log();
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.front(), HealthCheckResponse::SERVING);
  EXPECT_EQ(states.back(), HealthCheckResponse::NOT_SERVING)
      << "the watch was not told NOT_SERVING before it was closed";
}

TEST(ShutdownTest, CallsDuringShutdownAreUnavailableNeverCancelled) {
  // An open Batch stream may finish until the shutdown deadline: the
  // transition lasts as long as it stays open. Calls started meanwhile, on
  // connections old and new, must get UNAVAILABLE (retryable).
  auto server = ServerProcess::Start({"--shutdown_timeout=30s"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(10));
  ASSERT_TRUE(client->Echo(MakeEcho(v1::FLOAT32, {3})).ok());
  const std::vector<float> data(16, 1.0f);
  absl::StatusOr<v1::TensorInfo> kept = client->Upload(v1::FLOAT32, {16}, data.data());
  ASSERT_TRUE(kept.ok()) << kept.status();

  auto stub = v1::Compute::NewStub(client->channel());
  grpc::ClientContext batch_ctx;
  batch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto batch = stub->Batch(&batch_ctx);
  {
    // One item answered: the stream is open on the server.
    v1::BatchRequest item;
    item.set_id("before");
    *item.mutable_transpose() = MakeTranspose(v1::FLOAT32, {2, 3});
    ASSERT_TRUE(batch->Write(item));
    v1::BatchResponse answer;
    ASSERT_TRUE(batch->Read(&answer));
    ASSERT_EQ(answer.code(), 0) << answer.message();
  }

  (*server)->Signal(SIGTERM);
  constexpr int kCallers = 4;
  std::vector<std::vector<absl::Status>> seen(kCallers);
  std::vector<std::thread> callers;
  const absl::Time until = absl::Now() + absl::Seconds(2);
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      // Half share the connection of the open stream, half reconnect.
      std::unique_ptr<Client> own =
          (*server)->NewClient(absl::Seconds(10), /*own_connection=*/i % 2 == 1);
      Client& caller = i % 2 == 0 ? *client : *own;
      while (absl::Now() < until) {
        seen[i].push_back(caller.Echo(MakeEcho(v1::FLOAT32, {3})).status());
        absl::SleepFor(absl::Milliseconds(5));
      }
    });
  }
  for (std::thread& t : callers) t.join();
  // Transfers started during the drain are refused the same way (they were
  // accepted, to be cut off when the drain ended).
  absl::Status upload = client->Upload(v1::FLOAT32, {16}, data.data()).status();
  EXPECT_EQ(upload.code(), absl::StatusCode::kUnavailable) << upload;
  absl::Status download = client->DownloadTensor(kept->handle()).status();
  EXPECT_EQ(download.code(), absl::StatusCode::kUnavailable) << download;
  batch->WritesDone();
  v1::BatchResponse answer;
  while (batch->Read(&answer)) {
  }
  const grpc::Status batch_status = batch->Finish();
  auto status = (*server)->Wait(absl::Seconds(60));

  int calls = 0;
  int unavailable = 0;
  for (int i = 0; i < kCallers; ++i) {
    for (const absl::Status& s : seen[i]) {
      ++calls;
      if (s.code() == absl::StatusCode::kUnavailable) ++unavailable;
      // OK only for a call that beat the signal to the server.
      EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kUnavailable)
          << "caller " << i << " (" << (i % 2 == 0 ? "shared" : "own") << " connection): " << s;
    }
  }
  EXPECT_GT(unavailable, calls / 2) << unavailable << " of " << calls << " calls UNAVAILABLE";
  EXPECT_TRUE(batch_status.ok()) << batch_status.error_code() << " "
                                 << batch_status.error_message();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status)) << "killed by signal " << WTERMSIG(*status);
  EXPECT_EQ(WEXITSTATUS(*status), 0) << (*server)->Log();
}

TEST(ShutdownTest, SigintWhenIdleExitsZero) {
  auto server = ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(10));
  ASSERT_TRUE(client->Echo(MakeEcho(v1::FLOAT16, {7})).ok());
  (*server)->Signal(SIGINT);
  auto status = (*server)->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0) << (*server)->Log();
}

}  // namespace
}  // namespace gpucompute::testing
