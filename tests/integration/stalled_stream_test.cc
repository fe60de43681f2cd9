// A Batch stream whose client stops reading its answers: the answers waiting
// to be written hold admission for their own bytes only, so every other
// client is served at once in the room left, and after
// --stalled_stream_timeout the stream is ended RESOURCE_EXHAUSTED with a
// message that says why. A client that pauses for less than that gets every
// answer.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gpucompute/v1/compute.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

// The reproduction of the issue: a 256 MiB admission limit, two transposes
// whose answers are 64 MiB each (far over any HTTP/2 window, so their writes
// wait for the client to read) and each hold 128 MiB while they run.
constexpr int64_t kMaxInflightBytes = int64_t{256} << 20;
constexpr int64_t kSide = 4096;  // 4096 x 4096 float32: 64 MiB
constexpr int kItems = 2;
constexpr absl::Duration kStallTimeout = absl::Seconds(3);

std::vector<std::string> ServerArgs() {
  return {absl::StrCat("--max_inflight_bytes=", kMaxInflightBytes),
          absl::StrCat("--stalled_stream_timeout=", absl::FormatDuration(kStallTimeout))};
}

v1::BatchRequest LargeTranspose(const std::string& id) {
  v1::BatchRequest item;
  item.set_id(id);
  v1::TransposeRequest* t = item.mutable_transpose();
  t->mutable_input()->set_dtype(v1::FLOAT32);
  t->mutable_input()->add_shape(kSide);
  t->mutable_input()->add_shape(kSide);
  std::string data(kSide * kSide * 4, '\0');
  // Each element's bytes name its row and column (a transpose moves them).
  for (int64_t i = 0; i < kSide; ++i) {
    for (int64_t j = 0; j < kSide; ++j) {
      data[(i * kSide + j) * 4] = static_cast<char>(i);
      data[(i * kSide + j) * 4 + 1] = static_cast<char>(j);
    }
  }
  t->mutable_input()->set_data(std::move(data));
  t->add_perm(1);
  t->add_perm(0);
  return item;
}

// Sum of the samples of `name` whose labels include every `labels` pair;
// -1 when /metrics cannot be read.
double MetricSum(int metrics_port, const std::string& name,
                 const std::vector<std::string>& labels = {}) {
  auto text = HttpGet(metrics_port, "/metrics");
  if (!text.ok()) return -1;
  double total = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t end = line.find_first_of("{ ");
    if (end == absl::string_view::npos || line.substr(0, end) != name) continue;
    bool match = true;
    for (const std::string& l : labels) match = match && absl::StrContains(line, l);
    double value = 0;
    if (match && absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) total += value;
  }
  return total;
}

// Waits up to `timeout` for MetricSum(...) to reach `value`; the last value.
double AwaitMetric(int metrics_port, const std::string& name,
                   const std::vector<std::string>& labels, double value, absl::Duration timeout) {
  double seen = MetricSum(metrics_port, name, labels);
  for (const absl::Time until = absl::Now() + timeout; seen != value && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(10));
    seen = MetricSum(metrics_port, name, labels);
  }
  return seen;
}

// Opens a Batch stream on a connection of its own, sends the large items and
// half-closes, without reading anything.
struct StalledStream {
  explicit StalledStream(const ServerProcess& server)
      : client(server.NewClient(absl::Seconds(30), /*own_connection=*/true)),
        stub(v1::Compute::NewStub(client->channel())) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    stream = stub->Batch(&context);
  }
  bool SendAndHalfClose() {
    for (int i = 0; i < kItems; ++i) {
      if (!stream->Write(LargeTranspose(absl::StrCat("large-", i)))) return false;
    }
    return stream->WritesDone();
  }

  std::unique_ptr<Client> client;
  std::unique_ptr<v1::Compute::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::BatchRequest, v1::BatchResponse>> stream;
};

TEST(StalledStreamTest, OthersAreServedAndTheStreamEndsAfterTheTimeout) {
  auto server = ServerProcess::Start(ServerArgs());
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = (*server)->metrics_port();

  StalledStream stalled(**server);
  ASSERT_TRUE(stalled.SendAndHalfClose());
  // Both answers computed: one being written, one queued behind it.
  const double computed =
      AwaitMetric(metrics_port, "gpucompute_requests_total",
                  {"method=\"Batch/Transpose\"", "code=\"OK\""}, kItems, absl::Seconds(30));
  ASSERT_EQ(computed, kItems) << "the large items were not computed in time";
  const absl::Time computed_at = absl::Now();
  const double held_bytes = MetricSum(metrics_port, "gpucompute_inflight_bytes");

  // Another client's small GEMM, with a deadline shorter than the stall
  // timeout: it must not wait for the stalled stream.
  auto other = (*server)->NewClient(absl::Seconds(2), /*own_connection=*/true);
  const absl::Time gemm_start = absl::Now();
  auto gemm = other->Gemm(MakeGemm(v1::FLOAT32, {.m = 64, .n = 64, .k = 64}));
  const absl::Duration gemm_took = absl::Now() - gemm_start;
  EXPECT_TRUE(gemm.ok()) << gemm.status() << " after " << gemm_took << " (the stalled stream held "
                         << held_bytes << " bytes of admission)";
  EXPECT_LT(gemm_took, absl::Seconds(1)) << "held " << held_bytes << " bytes";

  // The server ends the stalled stream soon after the timeout (counted under
  // its code), and the client is told why once it reads again.
  const double ended =
      AwaitMetric(metrics_port, "gpucompute_requests_total",
                  {"method=\"Batch\"", "code=\"RESOURCE_EXHAUSTED\""}, 1, kStallTimeout * 3);
  const absl::Duration stalled_for = absl::Now() - computed_at;
  int answers_read = 0;
  v1::BatchResponse answer;
  while (stalled.stream->Read(&answer)) ++answers_read;
  const grpc::Status status = stalled.stream->Finish();
  std::printf(
      "stalled stream: inflight bytes %.0f while stalled; other GEMM %s in %s; stream "
      "ended %s after its answers were computed; %d answers read then, status %d (%s)\n",
      held_bytes, gemm.ok() ? "OK" : std::string(gemm.status().ToString()).c_str(),
      absl::FormatDuration(gemm_took).c_str(),
      ended == 1 ? absl::FormatDuration(stalled_for).c_str() : "never", answers_read,
      status.error_code(), status.error_message().c_str());
  EXPECT_EQ(ended, 1) << "the stalled stream was not ended within " << kStallTimeout * 3;
  EXPECT_LT(stalled_for, kStallTimeout + absl::Seconds(2));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "--stalled_stream_timeout"))
      << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "did not read")) << status.error_message();
  EXPECT_LT(answers_read, kItems);

  // Nothing of it left in flight.
  EXPECT_EQ(AwaitMetric(metrics_port, "gpucompute_inflight_requests", {}, 0, absl::Seconds(5)), 0);
  EXPECT_EQ(MetricSum(metrics_port, "gpucompute_inflight_bytes"), 0);
  auto after = other->Gemm(MakeGemm(v1::FLOAT32, {.m = 64, .n = 64, .k = 64}));
  EXPECT_TRUE(after.ok()) << after.status();
}

TEST(StalledStreamTest, AReaderThatPausesLessThanTheTimeoutGetsEveryAnswer) {
  auto server = ServerProcess::Start(ServerArgs());
  ASSERT_TRUE(server.ok()) << server.status();
  StalledStream slow(**server);
  ASSERT_TRUE(slow.SendAndHalfClose());
  // Both answers computed and waiting, for a third of the timeout.
  ASSERT_EQ(AwaitMetric((*server)->metrics_port(), "gpucompute_requests_total",
                        {"method=\"Batch/Transpose\"", "code=\"OK\""}, kItems, absl::Seconds(30)),
            kItems);
  absl::SleepFor(kStallTimeout / 3);

  const v1::BatchRequest expected = LargeTranspose("");
  const std::string& in = expected.transpose().input().data();
  std::vector<std::string> ids;
  v1::BatchResponse answer;
  while (slow.stream->Read(&answer)) {
    ids.push_back(answer.id());
    ASSERT_EQ(answer.code(), 0) << answer.message();
    const std::string& out = answer.transpose().output().data();
    ASSERT_EQ(out.size(), in.size());
    for (int64_t i = 0; i < kSide; ++i) {
      for (int64_t j = 0; j < kSide; ++j) {  // out[j][i] == in[i][j]
        ASSERT_EQ(out.compare((j * kSide + i) * 4, 4, in, (i * kSide + j) * 4, 4), 0)
            << "at " << i << "," << j;
      }
    }
  }
  const grpc::Status status = slow.stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  EXPECT_EQ(ids.size(), kItems);
}

}  // namespace
}  // namespace gpucompute::testing
