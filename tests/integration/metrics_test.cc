// /metrics of the real server: scraped over HTTP, clean under
// `promtool check metrics`, and counting what was served.
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

TEST(MetricsTest, ScrapedAndCleanUnderPromtool) {
  ASSERT_NE(std::string(PromtoolPath()), "")
      << "promtool was not found at configure time (Debian package prometheus)";
  auto server = ServerProcess::Start({"--cpu_devices=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->metrics_port(), 0);
  auto client = (*server)->NewClient(absl::Seconds(20));

  // Before any request the exposition is already valid.
  TempDir dir;
  auto check = [&](const std::string& text, const std::string& file) {
    std::ofstream(dir.File(file)) << text;
    CommandResult promtool =
        RunCommand({PromtoolPath(), "check", "metrics"}, absl::Seconds(30), dir.File(file));
    EXPECT_EQ(promtool.exit_code, 0) << promtool.output;
    EXPECT_EQ(promtool.output, "") << "promtool complained";
  };
  auto before = HttpGet((*server)->metrics_port(), "/metrics");
  ASSERT_TRUE(before.ok()) << before.status();
  check(*before, "before.txt");

  // Traffic: every operation in every dtype, a failure, an echo.
  for (v1::DType dtype : kAllDTypes) {
    ASSERT_TRUE(client->Gemm(MakeGemm(dtype, {.m = 33, .n = 7, .k = 7})).ok());
    ASSERT_TRUE(client->Gemv(MakeGemv(dtype, {.m = 33, .k = 7})).ok());
    ASSERT_TRUE(client->Reduce(MakeReduce(dtype, {33, 7}, v1::SUM)).ok());
    ASSERT_TRUE(client->Transpose(MakeTranspose(dtype, {33, 7})).ok());
    ASSERT_TRUE(client->Attention(MakeAttention(dtype, {.seq_q = 7, .seq_kv = 7})).ok());
  }
  ASSERT_TRUE(client->Echo(MakeEcho(v1::FLOAT32, {1000})).ok());
  v1::GemmRequest bad = MakeGemm(v1::FLOAT32, {.m = 3, .n = 3, .k = 3});
  bad.mutable_a()->set_dtype(v1::DTYPE_UNSPECIFIED);
  ASSERT_EQ(client->Gemm(bad).status().code(), absl::StatusCode::kInvalidArgument);

  auto after = HttpGet((*server)->metrics_port(), "/metrics");
  ASSERT_TRUE(after.ok()) << after.status();
  check(*after, "after.txt");
  const std::string& m = *after;

  for (const char* family :
       {"gpucompute_requests_total", "gpucompute_request_duration_seconds",
        "gpucompute_kernel_duration_seconds", "gpucompute_received_bytes_total",
        "gpucompute_sent_bytes_total", "gpucompute_inflight_requests", "gpucompute_queue_depth",
        "gpucompute_device_info", "gpucompute_transfer_duration_seconds",
        "gpucompute_transfer_bytes_total", "gpucompute_device_memory_used_bytes",
        "gpucompute_device_memory_total_bytes", "gpucompute_device_inflight_shards",
        "gpucompute_device_inflight_bytes", "gpucompute_device_healthy",
        "gpucompute_device_peer_access"}) {
    EXPECT_TRUE(absl::StrContains(m, absl::StrCat("# TYPE ", family, " ")))
        << "no metric family " << family;
  }
  for (const char* family :
       {"gpucompute_queue_duration_seconds histogram", "gpucompute_build_info gauge",
        "gpucompute_host_kept_bytes gauge", "gpucompute_request_arena_bytes_total counter",
        "process_cpu_seconds_total counter", "process_resident_memory_bytes gauge",
        "process_virtual_memory_bytes gauge", "process_open_fds gauge", "process_max_fds gauge",
        "process_start_time_seconds gauge"}) {
    EXPECT_TRUE(absl::StrContains(m, absl::StrCat("# TYPE ", family, "\n"))) << family;
  }
  // Every operation that was admitted waited in the queue once (the invalid
  // Gemm and the Echo did not).
  EXPECT_EQ(MetricSum(m, "gpucompute_queue_duration_seconds_count"), 15);
  EXPECT_EQ(MetricSum(m, "gpucompute_build_info", {"version=\""}), 1);
  EXPECT_GT(MetricSum(m, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GT(MetricSum(m, "process_open_fds"), 3);
  EXPECT_GT(MetricSum(m, "process_max_fds"), MetricSum(m, "process_open_fds"));
  EXPECT_GT(MetricSum(m, "process_cpu_seconds_total"), 0);
  const double now = absl::ToUnixSeconds(absl::Now());
  EXPECT_LE(MetricSum(m, "process_start_time_seconds"), now + 1);
  EXPECT_GT(MetricSum(m, "process_start_time_seconds"), now - 300);
  EXPECT_TRUE(absl::StrContains(m, "# TYPE gpucompute_request_duration_seconds histogram"));
  EXPECT_TRUE(absl::StrContains(m, "# TYPE gpucompute_kernel_duration_seconds histogram"));

  EXPECT_EQ(MetricSum(m, "gpucompute_requests_total", {"method=\"Gemm\"", "code=\"OK\""}), 3);
  EXPECT_EQ(
      MetricSum(m, "gpucompute_requests_total", {"method=\"Gemm\"", "code=\"INVALID_ARGUMENT\""}),
      1);
  EXPECT_EQ(MetricSum(m, "gpucompute_requests_total", {"method=\"Echo\"", "code=\"OK\""}), 1);
  EXPECT_GE(MetricSum(m, "gpucompute_request_duration_seconds_count", {"method=\"Attention\""}), 3);
  for (const char* op : {"gemm", "gemv", "reduce", "transpose", "attention"}) {
    for (const char* dtype : {"float32", "float16", "bfloat16"}) {
      SCOPED_TRACE(absl::StrCat(op, " ", dtype));
      std::vector<std::string> labels = {absl::StrCat("op=\"", op, "\""),
                                         absl::StrCat("dtype=\"", dtype, "\"")};
      EXPECT_GE(MetricSum(m, "gpucompute_kernel_duration_seconds_count", labels), 1);
      EXPECT_GT(MetricSum(m, "gpucompute_kernel_duration_seconds_sum", labels), 0);
      EXPECT_GE(MetricSum(m, "gpucompute_kernel_duration_seconds_bucket",
                          {labels[0], labels[1], "le=\"+Inf\""}),
                1);
    }
  }
  EXPECT_GT(MetricSum(m, "gpucompute_received_bytes_total"), 4000);
  EXPECT_GT(MetricSum(m, "gpucompute_sent_bytes_total"), 4000);
  EXPECT_EQ(MetricSum(m, "gpucompute_inflight_requests"), 0);
  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(MetricSum(m, "gpucompute_device_info"), info->devices_size());

  // Per-device gauges, refreshed by the scrape, for every device the server
  // lists; the topology as one series per peer pair.
  int peer_pairs = 0;
  for (const auto& device : info->devices()) {
    SCOPED_TRACE(absl::StrCat("device ", device.index(), " (", device.kind(), ")"));
    const std::string label = absl::StrCat("device=\"", device.index(), "\"");
    auto has = [&](const std::string& series) {
      return absl::StrContains(m, absl::StrCat(series, "{", label, "}"));
    };
    ASSERT_TRUE(has("gpucompute_device_memory_used_bytes"));
    ASSERT_TRUE(has("gpucompute_device_memory_total_bytes"));
    ASSERT_TRUE(has("gpucompute_device_inflight_shards"));
    ASSERT_TRUE(has("gpucompute_device_inflight_bytes"));
    ASSERT_TRUE(has("gpucompute_device_healthy"));
    const double used = MetricSum(m, "gpucompute_device_memory_used_bytes", {label});
    const double total = MetricSum(m, "gpucompute_device_memory_total_bytes", {label});
    // GPUs carry the identity the DCGM exporter labels them with.
    const bool identified =
        absl::StrContains(m, absl::StrCat("UUID=\"GPU-")) && absl::StrContains(m, "pci_bus_id=\"");
    EXPECT_EQ(identified, device.kind() == "cuda");
    if (device.kind() == "cpu") {
      EXPECT_EQ(used, 0);
      EXPECT_EQ(total, device.memory_bytes());
    } else {
      EXPECT_GT(used, 0);
      EXPECT_LE(used, total);
    }
    EXPECT_GT(total, 0);
    EXPECT_EQ(MetricSum(m, "gpucompute_device_inflight_shards", {label}), 0);
    EXPECT_EQ(MetricSum(m, "gpucompute_device_inflight_bytes", {label}), 0);
    EXPECT_EQ(MetricSum(m, "gpucompute_device_healthy", {label}), 1);
    for (const char* direction : {"host_to_device", "device_to_host"}) {
      EXPECT_TRUE(absl::StrContains(m, absl::StrCat("gpucompute_transfer_bytes_total{", label,
                                                    ",direction=\"", direction, "\"}")))
          << direction;
    }
    for (int peer : device.peers()) {
      EXPECT_EQ(MetricSum(m, "gpucompute_device_peer_access",
                          {label, absl::StrCat("peer=\"", peer, "\"")}),
                1)
          << "peer " << peer;
    }
    peer_pairs += device.peers_size();
  }
  EXPECT_EQ(MetricSum(m, "gpucompute_device_peer_access"), peer_pairs);
  // Copies happen on GPUs only.
  if (info->devices(0).kind() == "cuda") {
    EXPECT_GT(MetricSum(m, "gpucompute_transfer_bytes_total", {"direction=\"host_to_device\""}), 0);
    EXPECT_GT(MetricSum(m, "gpucompute_transfer_bytes_total", {"direction=\"device_to_host\""}), 0);
    EXPECT_GT(MetricSum(m, "gpucompute_transfer_duration_seconds_count"), 0);
  } else {
    EXPECT_EQ(MetricSum(m, "gpucompute_transfer_bytes_total"), 0);
    EXPECT_EQ(MetricSum(m, "gpucompute_transfer_duration_seconds_count"), 0);
  }
}

}  // namespace
}  // namespace gpucompute::testing
