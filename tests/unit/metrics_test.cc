// The metrics layer: every family exists with conventional names, recording
// moves the right series, and the HTTP exposition passes promtool.
#include "server/metrics/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proto/host_memory.h"
#include "server/device/identity.h"
#include "server/metrics/build_info.h"
#include "server/metrics/process_stats.h"

namespace gpucompute {
namespace {

// name -> type from the "# TYPE" lines of an exposition.
std::map<std::string, std::string> Types(const std::string& text) {
  std::map<std::string, std::string> types;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "# TYPE ")) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() == 4) types[parts[2]] = parts[3];
  }
  return types;
}

// The value of the sample line that starts with `series` (name{labels}), or
// -1 when there is none.
double Sample(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      return std::stod(std::string(line.substr(series.size() + 1)));
    }
  }
  return -1;
}

DeviceDescription Cpu(int index) {
  DeviceDescription d;
  d.index = index;
  d.kind = "cpu";
  d.name = absl::StrCat("cpu:", index);
  return d;
}

// Two GPUs that reach each other's memory.
std::vector<DeviceDescription> GpuPair() {
  std::vector<DeviceDescription> devices(2);
  for (int i = 0; i < 2; ++i) {
    devices[i].index = i;
    devices[i].kind = "cuda";
    devices[i].name = absl::StrCat("H200 (cuda:", i, ")");
    devices[i].memory_bytes = int64_t{150} << 30;
    devices[i].peers = {1 - i};
  }
  return devices;
}

// A shard that copied both ways.
ShardTiming CopyingShard() {
  ShardTiming shard;
  shard.run.variant = "v1";
  shard.run.kernel_seconds = 0.001;
  shard.run.h2d_seconds = 0.002;
  shard.run.d2h_seconds = 0.0005;
  shard.run.h2d_bytes = 3e6;
  shard.run.d2h_bytes = 1e6;
  return shard;
}

TEST(MetricsTest, EveryFamilyExistsWithConventionalNames) {
  Metrics metrics;
  metrics.AddMethod("Gemm");
  std::vector<DeviceDescription> devices = GpuPair();
  metrics.SetDevices(devices);
  // Kernel durations are exported from the first shard on (their label sets
  // are not known before).
  ShardTiming shard;
  shard.run.variant = "naive";
  metrics.OnShard(OpKind::kTranspose, DType::kFloat16, devices[0], shard);
  const std::map<std::string, std::string> types = Types(metrics.Scrape());
  const std::map<std::string, std::string> want = {
      {"gpucompute_requests_total", "counter"},
      {"gpucompute_request_duration_seconds", "histogram"},
      {"gpucompute_kernel_duration_seconds", "histogram"},
      {"gpucompute_kernel_bytes_total", "counter"},
      {"gpucompute_kernel_flops_total", "counter"},
      {"gpucompute_received_bytes_total", "counter"},
      {"gpucompute_sent_bytes_total", "counter"},
      {"gpucompute_inflight_requests", "gauge"},
      {"gpucompute_inflight_bytes", "gauge"},
      {"gpucompute_queue_depth", "gauge"},
      {"gpucompute_device_info", "gauge"},
      {"gpucompute_transfer_duration_seconds", "histogram"},
      {"gpucompute_transfer_bytes_total", "counter"},
      {"gpucompute_device_memory_used_bytes", "gauge"},
      {"gpucompute_device_memory_total_bytes", "gauge"},
      {"gpucompute_device_inflight_shards", "gauge"},
      {"gpucompute_device_inflight_bytes", "gauge"},
      {"gpucompute_device_healthy", "gauge"},
      {"gpucompute_device_peer_access", "gauge"},
  };
  for (const auto& [name, type] : want) {
    auto it = types.find(name);
    ASSERT_NE(it, types.end()) << name << " is not exported";
    EXPECT_EQ(it->second, type) << name;
  }
  for (const char* process : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                              "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                              "process_start_time_seconds"}) {
    auto it = types.find(process);
    ASSERT_NE(it, types.end()) << process << " is not exported";
    EXPECT_EQ(it->second, absl::EndsWith(process, "_total") ? "counter" : "gauge") << process;
  }
  EXPECT_EQ(types.at("gpucompute_queue_duration_seconds"), "histogram");
  EXPECT_EQ(types.at("gpucompute_build_info"), "gauge");
  for (const auto& [name, type] : types) {
    // Ours, or the process metrics every Prometheus client library exports.
    EXPECT_TRUE(absl::StartsWith(name, "gpucompute_") || absl::StartsWith(name, "process_"))
        << name;
    EXPECT_EQ(absl::EndsWith(name, "_total"), type == "counter") << name;
    if (type == "histogram") {
      EXPECT_TRUE(absl::EndsWith(name, "_seconds")) << name;
    }
    EXPECT_EQ(name, absl::AsciiStrToLower(name)) << name;
  }
}

TEST(MetricsTest, RequestsMoveTheirSeries) {
  Metrics metrics;
  metrics.AddMethod("Gemm");
  std::string text = metrics.Scrape();
  EXPECT_EQ(Sample(text, R"(gpucompute_requests_total{code="OK",method="Gemm"})"), 0);
  EXPECT_EQ(Sample(text, R"(gpucompute_request_duration_seconds_count{method="Gemm"})"), 0);

  metrics.RequestStarted();
  metrics.RequestStarted();
  EXPECT_EQ(Sample(metrics.Scrape(), "gpucompute_inflight_requests"), 2);
  metrics.RequestFinished("Gemm", absl::StatusCode::kOk, 0.003);
  metrics.RequestFinished("Gemm", absl::StatusCode::kInvalidArgument, 0.0001);
  metrics.ItemFinished("Batch/Reduce", absl::StatusCode::kOk, 0.2);
  metrics.AddReceivedBytes(1000);
  metrics.AddSentBytes(24);
  metrics.AddQueueDepth(3);
  metrics.AddQueueDepth(-1);
  metrics.AddInflightBytes(4096);

  text = metrics.Scrape();
  EXPECT_EQ(Sample(text, "gpucompute_inflight_requests"), 0);
  EXPECT_EQ(Sample(text, R"(gpucompute_requests_total{code="OK",method="Gemm"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_requests_total{code="INVALID_ARGUMENT",method="Gemm"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_requests_total{code="OK",method="Batch/Reduce"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_request_duration_seconds_count{method="Gemm"})"), 2);
  EXPECT_NEAR(Sample(text, R"(gpucompute_request_duration_seconds_sum{method="Gemm"})"), 0.0031,
              1e-12);
  EXPECT_EQ(
      Sample(text, R"(gpucompute_request_duration_seconds_bucket{method="Gemm",le="0.0001"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_request_duration_seconds_bucket{method="Gemm",le="+Inf"})"),
            2);
  EXPECT_EQ(Sample(text, "gpucompute_received_bytes_total"), 1000);
  EXPECT_EQ(Sample(text, "gpucompute_sent_bytes_total"), 24);
  EXPECT_EQ(Sample(text, "gpucompute_queue_depth"), 2);
  EXPECT_EQ(Sample(text, "gpucompute_inflight_bytes"), 4096);
}

TEST(MetricsTest, TokenSeriesExistOnlyWithTokensAndCountByReason) {
  Metrics metrics;
  metrics.AuthRefused("invalid");  // not enabled: nothing happens
  metrics.TokensReloaded(true, 9);
  std::string text = metrics.Scrape();
  EXPECT_FALSE(absl::StrContains(text, "gpucompute_auth_refused_total")) << text;
  EXPECT_FALSE(absl::StrContains(text, "gpucompute_bearer_tokens")) << text;

  metrics.EnableTokenMetrics(3);
  text = metrics.Scrape();
  EXPECT_EQ(Types(text)["gpucompute_auth_refused_total"], "counter");
  EXPECT_EQ(Types(text)["gpucompute_token_reloads_total"], "counter");
  EXPECT_EQ(Types(text)["gpucompute_bearer_tokens"], "gauge");
  for (const char* reason : {"missing", "malformed", "invalid"}) {
    EXPECT_EQ(
        Sample(text, absl::StrCat(R"(gpucompute_auth_refused_total{reason=")", reason, R"("})")), 0)
        << reason;
  }
  EXPECT_EQ(Sample(text, "gpucompute_bearer_tokens"), 3);

  metrics.AuthRefused("missing");
  metrics.AuthRefused("invalid");
  metrics.AuthRefused("invalid");
  metrics.AuthRefused("something else");  // ignored
  metrics.TokensReloaded(true, 5);
  metrics.TokensReloaded(false, 5);
  text = metrics.Scrape();
  EXPECT_EQ(Sample(text, R"(gpucompute_auth_refused_total{reason="missing"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_auth_refused_total{reason="malformed"})"), 0);
  EXPECT_EQ(Sample(text, R"(gpucompute_auth_refused_total{reason="invalid"})"), 2);
  EXPECT_EQ(Sample(text, R"(gpucompute_token_reloads_total{result="ok"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_token_reloads_total{result="error"})"), 1);
  EXPECT_EQ(Sample(text, "gpucompute_bearer_tokens"), 5);
}

TEST(MetricsTest, ShardsMoveKernelSeriesAndDevicesAreListed) {
  Metrics metrics;
  std::vector<DeviceDescription> devices = {Cpu(0), Cpu(1)};
  metrics.SetDevices(devices);
  std::string text = metrics.Scrape();
  EXPECT_EQ(Sample(text, R"(gpucompute_device_info{device="1",kind="cpu",name="cpu:1"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_kernel_bytes_total{device="1",op="attention"})"), 0);

  ShardTiming shard;
  shard.run.variant = "openblas";
  shard.run.kernel_seconds = 0.002;
  shard.work = {1e6, 3e9};
  metrics.OnShard(OpKind::kGemm, DType::kBFloat16, devices[1], shard);
  metrics.OnShard(OpKind::kGemm, DType::kBFloat16, devices[1], shard);
  text = metrics.Scrape();
  EXPECT_EQ(Sample(text, R"(gpucompute_kernel_bytes_total{device="1",op="gemm"})"), 2e6);
  EXPECT_EQ(Sample(text, R"(gpucompute_kernel_flops_total{device="1",op="gemm"})"), 6e9);
  EXPECT_EQ(Sample(text, R"(gpucompute_kernel_flops_total{device="0",op="gemm"})"), 0);
  EXPECT_EQ(
      Sample(
          text,
          R"(gpucompute_kernel_duration_seconds_count{device="1",dtype="bfloat16",op="gemm",variant="openblas"})"),
      2);
}

TEST(MetricsTest, KernelBucketsStartAtOneMicrosecond) {
  Metrics metrics;
  std::vector<DeviceDescription> devices = GpuPair();
  metrics.SetDevices(devices);
  ShardTiming shard;
  shard.run.variant = "v9";
  shard.run.kernel_seconds = 2e-6;
  metrics.OnShard(OpKind::kGemv, DType::kFloat16, devices[0], shard);
  shard.run.kernel_seconds = 7e-6;
  metrics.OnShard(OpKind::kGemv, DType::kFloat16, devices[0], shard);
  const std::string text = metrics.Scrape();
  const std::string series =
      R"(gpucompute_kernel_duration_seconds_bucket{device="0",dtype="float16",op="gemv",variant="v9",le=")";
  EXPECT_EQ(Sample(text, series + R"(1e-06"})"), 0) << text;
  EXPECT_EQ(Sample(text, series + R"(2.5e-06"})"), 1);
  EXPECT_EQ(Sample(text, series + R"(5e-06"})"), 1);
  EXPECT_EQ(Sample(text, series + R"(1e-05"})"), 2);
  EXPECT_EQ(Sample(text, series + R"(+Inf"})"), 2);
}

TEST(MetricsTest, QueueTimeIsAHistogram) {
  Metrics metrics;
  metrics.ObserveQueue(0.003);
  metrics.ObserveQueue(20);
  metrics.ObserveQueue(2e-5);
  const std::string text = metrics.Scrape();
  EXPECT_EQ(Sample(text, "gpucompute_queue_duration_seconds_count"), 3);
  EXPECT_NEAR(Sample(text, "gpucompute_queue_duration_seconds_sum"), 20.00302, 1e-9);
  EXPECT_EQ(Sample(text, R"(gpucompute_queue_duration_seconds_bucket{le="1e-05"})"), 0) << text;
  EXPECT_EQ(Sample(text, R"(gpucompute_queue_duration_seconds_bucket{le="5e-05"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_queue_duration_seconds_bucket{le="0.005"})"), 2);
  EXPECT_EQ(Sample(text, R"(gpucompute_queue_duration_seconds_bucket{le="10"})"), 2);
  EXPECT_EQ(Sample(text, R"(gpucompute_queue_duration_seconds_bucket{le="30"})"), 3);
  EXPECT_EQ(Sample(text, R"(gpucompute_queue_duration_seconds_bucket{le="60"})"), 3);
}

TEST(MetricsTest, GpusCarryTheDcgmIdentityLabels) {
  Metrics metrics;
  std::vector<DeviceDescription> devices = GpuPair();
  devices[1].uuid = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52";
  devices[1].pci_bus_id = "00000000:19:00.0";
  devices.push_back(Cpu(2));
  metrics.SetDevices(devices);
  const std::string text = metrics.Scrape();
  EXPECT_EQ(
      Sample(
          text,
          R"x(gpucompute_device_info{UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",device="1",kind="cuda",name="H200 (cuda:1)",pci_bus_id="00000000:19:00.0"})x"),
      1)
      << text;
  // Devices without an identity (CPU devices) carry no empty labels.
  EXPECT_EQ(Sample(text, R"(gpucompute_device_info{device="2",kind="cpu",name="cpu:2"})"), 1);
}

TEST(DeviceIdentityTest, FormatsAsNvmlDoes) {
  const unsigned char uuid[16] = {0x60, 0x4a, 0xc7, 0x6c, 0xd9, 0xcf, 0xfe, 0xf3,
                                  0x62, 0xe9, 0xd9, 0x20, 0x44, 0xab, 0x6e, 0x52};
  EXPECT_EQ(GpuUuidString(uuid), "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52");
  EXPECT_EQ(PciBusIdString(0, 0x19, 0), "00000000:19:00.0");
  EXPECT_EQ(PciBusIdString(1, 0xab, 0x1f), "00000001:AB:1F.0");
}

TEST(MetricsTest, BuildInfoNamesThisBuild) {
  Metrics metrics;
  const std::string text = metrics.Scrape();
  const BuildInfo& build = ThisBuild();
  EXPECT_EQ(build.version, GPUCOMPUTE_TEST_VERSION);
  EXPECT_FALSE(build.revision.empty());
  EXPECT_FALSE(build.compiler.empty());
  EXPECT_FALSE(build.cuda.empty());
  EXPECT_EQ(Sample(text, absl::StrCat("gpucompute_build_info{compiler=\"", build.compiler,
                                      "\",cuda=\"", build.cuda, "\",revision=\"", build.revision,
                                      "\",version=\"", build.version, "\"}")),
            1)
      << text;
}

TEST(ProcessStatsTest, ParsesAStatLineWhoseNameHoldsSpacesAndParentheses) {
  // Fields 3..24 of proc(5); utime 250, stime 50 ticks, starttime 1000 ticks,
  // vsize 123456789 bytes, rss 300 pages.
  const std::string stat =
      "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1000 123456789 "
      "300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
  absl::StatusOr<ProcessStats> stats = ParseProcStat(stat, 100, 4096, 1.7e9);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_DOUBLE_EQ(stats->cpu_seconds, 3.0);
  EXPECT_DOUBLE_EQ(stats->start_time_seconds, 1.7e9 + 10);
  EXPECT_EQ(stats->virtual_bytes, 123456789);
  EXPECT_EQ(stats->resident_bytes, 300 * 4096);
  EXPECT_EQ(ParseProcStat("4242 (x) S 1 2 3", 100, 4096, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcStat("4242 x S 1 2 3", 100, 4096, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProcessStatsTest, ReadsThisProcess) {
  absl::StatusOr<ProcessStats> before = ReadProcessStats();
  ASSERT_TRUE(before.ok()) << before.status();
  // CPU time as getrusage counts it (to the kernel's tick), after some work.
  auto rusage_seconds = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
           1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  };
  const double cpu_before = rusage_seconds();
  volatile double sink = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (rusage_seconds() - cpu_before < 0.2 && absl::Now() < give_up) {
    for (int i = 0; i < 100000; ++i) sink = sink + i * 0.5;
  }
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  absl::StatusOr<ProcessStats> after = ReadProcessStats();
  const double cpu_after = rusage_seconds();
  close(fd);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GE(after->cpu_seconds - before->cpu_seconds, 0.15);
  EXPECT_NEAR(after->cpu_seconds, cpu_after, 0.05);
  EXPECT_EQ(after->open_fds, before->open_fds + 1);
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  EXPECT_EQ(after->max_fds, int64_t(limit.rlim_cur));
  const double now = absl::ToUnixSeconds(absl::Now());
  EXPECT_LE(after->start_time_seconds, now + 1);
  EXPECT_GT(after->start_time_seconds, now - 600) << "this test started over 10 minutes ago?";
  EXPECT_GT(after->resident_bytes, 1 << 20);
  EXPECT_GE(after->virtual_bytes, after->resident_bytes);
}

TEST(MetricsTest, ScrapeExportsTheHostMemoryKeptForLargeTensors) {
  LargeStringCache& cache = LargeStringCache::Default();
  cache.SetCapacity(int64_t{1} << 30);
  std::string buffer;
  buffer.reserve(LargeStringCache::kMinBytes);
  cache.Give(std::move(buffer));
  Metrics metrics;
  const std::string text = metrics.Scrape();
  EXPECT_TRUE(absl::StrContains(text, "# TYPE gpucompute_host_kept_bytes gauge\n"));
  EXPECT_EQ(Sample(text, "gpucompute_host_kept_bytes"), double(cache.kept_bytes()));
  EXPECT_GE(Sample(text, "gpucompute_host_kept_bytes"), double(LargeStringCache::kMinBytes));
  cache.SetCapacity(0);
  EXPECT_EQ(Sample(metrics.Scrape(), "gpucompute_host_kept_bytes"), 0);
}

TEST(MetricsTest, ScrapeExportsTheProcessStats) {
  Metrics metrics;
  const std::string text = metrics.Scrape();
  absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(Sample(text, "process_max_fds"), double(stats->max_fds));
  EXPECT_GT(Sample(text, "process_resident_memory_bytes"), 0);
  EXPECT_GT(Sample(text, "process_virtual_memory_bytes"), 0);
  EXPECT_NEAR(Sample(text, "process_start_time_seconds"), stats->start_time_seconds, 0.02);
  EXPECT_GE(Sample(text, "process_open_fds"), 3);
  EXPECT_GE(Sample(text, "process_cpu_seconds_total"), 0);
  EXPECT_LE(Sample(text, "process_cpu_seconds_total"), stats->cpu_seconds);
}

TEST(MetricsTest, ShardsMoveTransferSeries) {
  Metrics metrics;
  std::vector<DeviceDescription> devices = GpuPair();
  metrics.SetDevices(devices);
  const std::string h2d = R"(device="1",direction="host_to_device")";
  const std::string d2h = R"(device="1",direction="device_to_host")";
  std::string text = metrics.Scrape();
  EXPECT_EQ(Sample(text, "gpucompute_transfer_bytes_total{" + h2d + "}"), 0);
  EXPECT_EQ(Sample(text, "gpucompute_transfer_duration_seconds_count{" + d2h + "}"), 0);

  metrics.OnShard(OpKind::kGemm, DType::kFloat16, devices[1], CopyingShard());
  metrics.OnShard(OpKind::kGemv, DType::kFloat32, devices[1], CopyingShard());
  // A shard that copied nothing back is not observed device to host.
  ShardTiming upload_only = CopyingShard();
  upload_only.run.d2h_seconds = 0;
  upload_only.run.d2h_bytes = 0;
  metrics.OnShard(OpKind::kGemm, DType::kFloat16, devices[1], upload_only);
  // Nor is a CPU-style shard that copied nothing at all.
  ShardTiming cpu;
  cpu.run.variant = "cpu";
  metrics.OnShard(OpKind::kReduce, DType::kFloat32, devices[1], cpu);

  text = metrics.Scrape();
  EXPECT_EQ(Sample(text, "gpucompute_transfer_bytes_total{" + h2d + "}"), 9e6);
  EXPECT_EQ(Sample(text, "gpucompute_transfer_bytes_total{" + d2h + "}"), 2e6);
  EXPECT_EQ(Sample(text, "gpucompute_transfer_duration_seconds_count{" + h2d + "}"), 3);
  EXPECT_EQ(Sample(text, "gpucompute_transfer_duration_seconds_count{" + d2h + "}"), 2);
  EXPECT_NEAR(Sample(text, "gpucompute_transfer_duration_seconds_sum{" + h2d + "}"), 0.006, 1e-12);
  EXPECT_NEAR(Sample(text, "gpucompute_transfer_duration_seconds_sum{" + d2h + "}"), 0.001, 1e-12);
  EXPECT_EQ(Sample(text, "gpucompute_transfer_duration_seconds_bucket{" + d2h + R"(,le="0.0005"})"),
            2);
  EXPECT_EQ(Sample(text, "gpucompute_transfer_duration_seconds_bucket{" + h2d + R"(,le="0.001"})"),
            0);
  EXPECT_EQ(Sample(text, "gpucompute_transfer_duration_seconds_bucket{" + h2d + R"(,le="+Inf"})"),
            3);
  // The other device saw nothing.
  EXPECT_EQ(
      Sample(text, R"(gpucompute_transfer_bytes_total{device="0",direction="host_to_device"})"), 0);
}

TEST(MetricsTest, RefreshDrivesDeviceGaugesAndPeersAreListed) {
  Metrics metrics;
  std::vector<DeviceDescription> devices = GpuPair();
  metrics.SetDevices(devices);
  // Before any refresh: the total from the description, nothing in use.
  std::string text = metrics.Scrape();
  EXPECT_EQ(Sample(text, R"(gpucompute_device_memory_total_bytes{device="1"})"),
            double(int64_t{150} << 30));
  EXPECT_EQ(Sample(text, R"(gpucompute_device_memory_used_bytes{device="1"})"), 0);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_inflight_shards{device="0"})"), 0);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_healthy{device="0"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_peer_access{device="0",peer="1"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_peer_access{device="1",peer="0"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_peer_access{device="0",peer="0"})"), -1);

  int calls = 0;
  metrics.SetDeviceRefresh([&calls] {
    ++calls;
    std::vector<DeviceState> states(3);
    for (int i = 0; i < 3; ++i) {
      states[i].index = i;  // device 2 was never listed: ignored
      states[i].memory_used_bytes = (i + 1) * 1000 + calls;
      states[i].memory_total_bytes = 1 << 20;
      states[i].inflight_shards = i + calls;
      states[i].inflight_bytes = 100 * i + calls;
      states[i].healthy = i != 1;
    }
    return states;
  });
  text = metrics.Scrape();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_memory_used_bytes{device="0"})"), 1001);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_memory_used_bytes{device="1"})"), 2001);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_memory_total_bytes{device="1"})"), 1 << 20);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_inflight_shards{device="1"})"), 2);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_inflight_bytes{device="1"})"), 101);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_healthy{device="0"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_healthy{device="1"})"), 0);
  EXPECT_FALSE(absl::StrContains(text, R"(device="2")")) << text;
  // Every scrape refreshes.
  text = metrics.Scrape();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_inflight_shards{device="0"})"), 2);

  // Without a refresh the gauges keep their last values.
  metrics.SetDeviceRefresh(nullptr);
  text = metrics.Scrape();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_memory_used_bytes{device="0"})"), 1002);
}

// GET /metrics over a plain socket.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  return response;
}

TEST(MetricsTest, ServesHttpThatPromtoolAccepts) {
  Metrics metrics;
  metrics.AddMethod("Echo");
  std::vector<DeviceDescription> devices = GpuPair();
  devices.push_back(Cpu(2));
  metrics.SetDevices(devices);
  metrics.SetDeviceRefresh([] {
    DeviceState state;
    state.index = 0;
    state.memory_used_bytes = int64_t{3} << 30;
    state.memory_total_bytes = int64_t{150} << 30;
    state.inflight_shards = 1;
    return std::vector<DeviceState>{state};
  });
  metrics.RequestStarted();
  metrics.RequestFinished("Echo", absl::StatusCode::kOk, 0.001);
  ShardTiming reduce;
  reduce.run.variant = "cpu";
  reduce.run.kernel_seconds = 1e-4;
  metrics.OnShard(OpKind::kReduce, DType::kFloat32, devices[2], reduce);
  metrics.OnShard(OpKind::kGemm, DType::kBFloat16, devices[0], CopyingShard());

  ASSERT_TRUE(metrics.Serve("127.0.0.1:0").ok());
  ASSERT_GT(metrics.port(), 0);
  EXPECT_EQ(metrics.Serve("127.0.0.1:0").code(), absl::StatusCode::kFailedPrecondition);
  const std::string response = HttpGet(metrics.port(), "/metrics");
  ASSERT_TRUE(absl::StartsWith(response, "HTTP/1.1 200")) << response.substr(0, 200);
  const size_t body = response.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos);
  const std::string text = response.substr(body + 4);
  EXPECT_EQ(Sample(text, R"(gpucompute_requests_total{code="OK",method="Echo"})"), 1);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_memory_used_bytes{device="0"})"),
            double(int64_t{3} << 30));
  EXPECT_EQ(Sample(text, R"(gpucompute_device_inflight_shards{device="0"})"), 1);
  EXPECT_EQ(
      Sample(text, R"(gpucompute_transfer_bytes_total{device="0",direction="device_to_host"})"),
      1e6);
  EXPECT_EQ(Sample(text, R"(gpucompute_device_peer_access{device="1",peer="0"})"), 1);

  if (access("/usr/bin/promtool", X_OK) != 0) {
    GTEST_SKIP() << "promtool not installed (Debian package prometheus); lint skipped";
  }
  const std::string path = ::testing::TempDir() + "metrics_test_exposition.txt";
  std::ofstream(path) << text;
  FILE* pipe = popen(("/usr/bin/promtool check metrics < " + path + " 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string lint;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) lint += buffer;
  EXPECT_EQ(pclose(pipe), 0) << lint;
  EXPECT_EQ(lint, "") << "promtool check metrics reported problems";
  std::remove(path.c_str());
}

// A connected socket to 127.0.0.1:port, or -1.
int ConnectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Clients that connect and send nothing, or trickle half a request, used to
// hold the endpoint's only thread for 5 s each: ten of them delayed a scrape
// by 50 s, past Prometheus's scrape timeout.
TEST(MetricsTest, IdleConnectionsDoNotDelayAScrape) {
  Metrics metrics;
  metrics.AddMethod("Echo");
  ASSERT_TRUE(metrics.Serve("127.0.0.1:0").ok());
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) {
    const int fd = ConnectTo(metrics.port());
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  const int trickle = ConnectTo(metrics.port());
  ASSERT_GE(trickle, 0);
  ASSERT_EQ(write(trickle, "GET /met", 8), 8);

  const absl::Time start = absl::Now();
  const std::string response = HttpGet(metrics.port(), "/metrics");
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 200")) << response.substr(0, 200);
  EXPECT_LT(took, absl::Milliseconds(500)) << "a scrape behind 11 idle connections";

  // Many scrapes at once are all answered.
  std::vector<std::thread> scrapers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i) {
    scrapers.emplace_back([&] {
      if (absl::StartsWith(HttpGet(metrics.port(), "/metrics"), "HTTP/1.1 200")) ++ok;
    });
  }
  for (std::thread& t : scrapers) t.join();
  EXPECT_EQ(ok.load(), 16);

  // The trickling client is closed once its 5 s for the whole exchange pass.
  timeval tv{8, 0};
  setsockopt(trickle, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte;
  const absl::Time wait_start = absl::Now();
  EXPECT_EQ(read(trickle, &byte, 1), 0) << "the server should close it";
  EXPECT_LT(absl::Now() - wait_start, absl::Seconds(7));
  close(trickle);
  for (int fd : idle) close(fd);
}

TEST(MetricsTest, ServeReportsAnAddressInUse) {
  Metrics first;
  ASSERT_TRUE(first.Serve("127.0.0.1:0").ok());
  Metrics second;
  absl::Status status = second.Serve(absl::StrCat("127.0.0.1:", first.port()));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(second.port(), 0);
}

}  // namespace
}  // namespace gpucompute
