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
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

// Sum of the samples of `name` whose labels include every `labels` pair
// (written as `key="value"`).
double Sum(const std::string& text, const std::string& name,
           const std::vector<std::string>& labels = {}) {
  double total = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    size_t end = line.find_first_of("{ ");
    if (end == absl::string_view::npos || line.substr(0, end) != name) continue;
    bool match = true;
    for (const std::string& l : labels) match = match && absl::StrContains(line, l);
    if (!match) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) total += value;
  }
  return total;
}

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
        "gpucompute_device_info"}) {
    EXPECT_TRUE(absl::StrContains(m, absl::StrCat("# TYPE ", family, " ")))
        << "no metric family " << family;
  }
  EXPECT_TRUE(absl::StrContains(m, "# TYPE gpucompute_request_duration_seconds histogram"));
  EXPECT_TRUE(absl::StrContains(m, "# TYPE gpucompute_kernel_duration_seconds histogram"));

  EXPECT_EQ(Sum(m, "gpucompute_requests_total", {"method=\"Gemm\"", "code=\"OK\""}), 3);
  EXPECT_EQ(Sum(m, "gpucompute_requests_total", {"method=\"Gemm\"", "code=\"INVALID_ARGUMENT\""}),
            1);
  EXPECT_EQ(Sum(m, "gpucompute_requests_total", {"method=\"Echo\"", "code=\"OK\""}), 1);
  EXPECT_GE(Sum(m, "gpucompute_request_duration_seconds_count", {"method=\"Attention\""}), 3);
  for (const char* op : {"gemm", "gemv", "reduce", "transpose", "attention"}) {
    for (const char* dtype : {"float32", "float16", "bfloat16"}) {
      SCOPED_TRACE(absl::StrCat(op, " ", dtype));
      std::vector<std::string> labels = {absl::StrCat("op=\"", op, "\""),
                                         absl::StrCat("dtype=\"", dtype, "\"")};
      EXPECT_GE(Sum(m, "gpucompute_kernel_duration_seconds_count", labels), 1);
      EXPECT_GT(Sum(m, "gpucompute_kernel_duration_seconds_sum", labels), 0);
      EXPECT_GE(Sum(m, "gpucompute_kernel_duration_seconds_bucket",
                    {labels[0], labels[1], "le=\"+Inf\""}),
                1);
    }
  }
  EXPECT_GT(Sum(m, "gpucompute_received_bytes_total"), 4000);
  EXPECT_GT(Sum(m, "gpucompute_sent_bytes_total"), 4000);
  EXPECT_EQ(Sum(m, "gpucompute_inflight_requests"), 0);
  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(Sum(m, "gpucompute_device_info"), info->devices_size());
}

}  // namespace
}  // namespace gpucompute::testing
