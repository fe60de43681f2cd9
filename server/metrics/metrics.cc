#include "server/metrics/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "proto/host_memory.h"
#include "server/metrics/build_info.h"
#include "server/metrics/http_endpoint.h"
#include "server/metrics/process_stats.h"

namespace gpucompute {
namespace {

// Request latency: 100 us to 60 s.
const prometheus::Histogram::BucketBoundaries& RequestBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
      0.1,  0.25,   0.5,  1,    2.5,    5,    10,   30,     60};
  return *buckets;
}

// Kernel, transfer and stage time: 1 us to 10 s (most kernels of an H200 take
// tens of microseconds).
const prometheus::Histogram::BucketBoundaries& KernelBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      1e-6, 2.5e-6, 5e-6,   1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
      5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 0.5,  1,      2.5,  10};
  return *buckets;
}

// Queue time: 10 us up to the default deadline (60 s), which bounds a wait
// for admission.
const prometheus::Histogram::BucketBoundaries& QueueBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
      5e-2, 0.1,  0.25, 0.5,    1,    2.5,  5,      10,   30,   60};
  return *buckets;
}

// A family of one sample that a scrape reads whole, from /proc or from the
// host memory kept (prometheus-cpp's counters only count up from zero).
prometheus::MetricFamily OneSampleFamily(const char* name, const char* help,
                                         prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
  return family;
}

// The separator cannot occur in label values we build keys from (method
// names, variant names, codes).
constexpr char kSep = '\x1f';

// Values of the `direction` label of the transfer families.
constexpr char kHostToDevice[] = "host_to_device";
constexpr char kDeviceToHost[] = "device_to_host";

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("gpucompute_requests_total")
                    .Help("Requests answered, by RPC method and gRPC status code.")
                    .Register(*registry_)),
      request_duration_(prometheus::BuildHistogram()
                            .Name("gpucompute_request_duration_seconds")
                            .Help("Server time per request, from acceptance to response, by "
                                  "RPC method.")
                            .Register(*registry_)),
      kernel_duration_(prometheus::BuildHistogram()
                           .Name("gpucompute_kernel_duration_seconds")
                           .Help("Kernel time per shard, by operation, kernel variant, device "
                                 "and dtype.")
                           .Register(*registry_)),
      kernel_bytes_(prometheus::BuildCounter()
                        .Name("gpucompute_kernel_bytes_total")
                        .Help("Bytes the kernels had to move (inputs read once, outputs "
                              "written once), by operation and device.")
                        .Register(*registry_)),
      kernel_flops_(prometheus::BuildCounter()
                        .Name("gpucompute_kernel_flops_total")
                        .Help("Floating-point operations the kernels did, by operation and "
                              "device.")
                        .Register(*registry_)),
      transfer_duration_(prometheus::BuildHistogram()
                             .Name("gpucompute_transfer_duration_seconds")
                             .Help("Copy time per shard between host and device memory, by "
                                   "device and direction (host_to_device, device_to_host); "
                                   "shards that copied nothing that way are not observed.")
                             .Register(*registry_)),
      transfer_bytes_(prometheus::BuildCounter()
                          .Name("gpucompute_transfer_bytes_total")
                          .Help("Bytes copied between host and device memory, by device and "
                                "direction (host_to_device, device_to_host).")
                          .Register(*registry_)),
      device_info_(prometheus::BuildGauge()
                       .Name("gpucompute_device_info")
                       .Help("Compute devices of this server (value 1); GPUs carry the "
                             "UUID and pci_bus_id the DCGM exporter labels them with.")
                       .Register(*registry_)),
      device_memory_used_(prometheus::BuildGauge()
                              .Name("gpucompute_device_memory_used_bytes")
                              .Help("Device memory in use (GPUs, as cudaMemGetInfo reports it "
                                    "for the whole device; 0 on the CPU backend).")
                              .Register(*registry_)),
      device_memory_total_(prometheus::BuildGauge()
                               .Name("gpucompute_device_memory_total_bytes")
                               .Help("Device memory in total (on the CPU backend, the device's "
                                     "share of host memory).")
                               .Register(*registry_)),
      device_inflight_shards_(prometheus::BuildGauge()
                                  .Name("gpucompute_device_inflight_shards")
                                  .Help("Shards running on the device.")
                                  .Register(*registry_)),
      device_inflight_bytes_(prometheus::BuildGauge()
                                 .Name("gpucompute_device_inflight_bytes")
                                 .Help("Bytes (inputs plus outputs) of the shards admitted to "
                                       "the device, bounded by --device_max_inflight_bytes.")
                                 .Register(*registry_)),
      device_healthy_(prometheus::BuildGauge()
                          .Name("gpucompute_device_healthy")
                          .Help("1 while the device is healthy, 0 once it has failed for good "
                                "(it then gets no work).")
                          .Register(*registry_)),
      device_peer_access_(prometheus::BuildGauge()
                              .Name("gpucompute_device_peer_access")
                              .Help("Topology: 1 for each device that can reach peer's memory "
                                    "directly.")
                              .Register(*registry_)),
      stage_duration_(prometheus::BuildHistogram()
                          .Name("gpucompute_stage_duration_seconds")
                          .Help("Where requests' time goes, by stage: queue, decode (parse, "
                                "validate, resolve handles), receive (upload streams), "
                                "host_to_device, kernel, device_to_host (the longest shard's), "
                                "encode, send.")
                          .Register(*registry_)),
      resident_bytes_(prometheus::BuildGauge()
                          .Name("gpucompute_resident_bytes")
                          .Help("Bytes of resident tensors (and their replicas) in the "
                                "device's memory.")
                          .Register(*registry_)),
      resident_tensors_(prometheus::BuildGauge()
                            .Name("gpucompute_resident_tensors")
                            .Help("Resident tensors held by the device.")
                            .Register(*registry_)),
      resident_cap_(prometheus::BuildGauge()
                        .Name("gpucompute_resident_cap_bytes")
                        .Help("The device's bound on resident bytes "
                              "(--resident_max_bytes_per_device; 0: none).")
                        .Register(*registry_)) {
  uploaded_bytes_ = &prometheus::BuildCounter()
                         .Name("gpucompute_uploaded_bytes_total")
                         .Help("Bytes of resident tensors received by Upload streams.")
                         .Register(*registry_)
                         .Add({});
  downloaded_bytes_ = &prometheus::BuildCounter()
                           .Name("gpucompute_downloaded_bytes_total")
                           .Help("Bytes of resident tensors sent by Download streams.")
                           .Register(*registry_)
                           .Add({});
  expirations_ = &prometheus::BuildCounter()
                      .Name("gpucompute_resident_expirations_total")
                      .Help(
                          "Resident tensors freed because they went unused for longer than "
                          "--resident_lease.")
                      .Register(*registry_)
                      .Add({});
  {
    auto& family = prometheus::BuildCounter()
                       .Name("gpucompute_request_arena_bytes_total")
                       .Help(
                           "Bytes of request tensors of 1 MiB and more decoded into the request "
                           "arena (--request_staging_bytes; result=staged) or, for want of room "
                           "there, into ordinary memory (result=missed).")
                       .Register(*registry_);
    arena_staged_bytes_ = &family.Add({{"result", "staged"}});
    arena_missed_bytes_ = &family.Add({{"result", "missed"}});
  }
  queue_duration_ = &prometheus::BuildHistogram()
                         .Name("gpucompute_queue_duration_seconds")
                         .Help(
                             "Time operations waited from acceptance until they started: for "
                             "a worker, for admission (--max_inflight_bytes) and for room on "
                             "their devices; operations that gave up waiting included.")
                         .Register(*registry_)
                         .Add({}, QueueBuckets());
  const BuildInfo& build = ThisBuild();
  prometheus::BuildGauge()
      .Name("gpucompute_build_info")
      .Help(
          "What this server was built from (value 1): version, git revision, compiler and "
          "the CUDA toolkit (none: a CPU-only build).")
      .Register(*registry_)
      .Add({{"version", build.version},
            {"revision", build.revision},
            {"compiler", build.compiler},
            {"cuda", build.cuda}})
      .Set(1);
  for (const char* stage : {"queue", "decode", "receive", "host_to_device", "kernel",
                            "device_to_host", "encode", "send"}) {
    stage_histograms_[stage] = &stage_duration_.Add({{"stage", stage}}, KernelBuckets());
  }
  received_bytes_ = &prometheus::BuildCounter()
                         .Name("gpucompute_received_bytes_total")
                         .Help("Bytes of request messages received.")
                         .Register(*registry_)
                         .Add({});
  sent_bytes_ = &prometheus::BuildCounter()
                     .Name("gpucompute_sent_bytes_total")
                     .Help("Bytes of response messages sent.")
                     .Register(*registry_)
                     .Add({});
  inflight_requests_ = &prometheus::BuildGauge()
                            .Name("gpucompute_inflight_requests")
                            .Help("Requests (and batch streams) being served.")
                            .Register(*registry_)
                            .Add({});
  inflight_bytes_ = &prometheus::BuildGauge()
                         .Name("gpucompute_inflight_bytes")
                         .Help(
                             "Host memory held by admitted calls (requests received and "
                             "decoded, results, answers until sent), limited by "
                             "--max_inflight_bytes.")
                         .Register(*registry_)
                         .Add({});
  queue_depth_ = &prometheus::BuildGauge()
                      .Name("gpucompute_queue_depth")
                      .Help(
                          "Operations accepted and waiting to start (for a worker or for "
                          "admission).")
                      .Register(*registry_)
                      .Add({});
}

Metrics::~Metrics() = default;

absl::Status Metrics::Serve(const std::string& listen) {
  if (endpoint_ != nullptr) return absl::FailedPreconditionError("metrics are already served");
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> endpoint =
      HttpEndpoint::Start(listen, [this] { return Scrape(); });
  if (!endpoint.ok()) return endpoint.status();
  port_ = (*endpoint)->port();
  endpoint_ = std::move(*endpoint);
  return absl::OkStatus();
}

std::string Metrics::Scrape() const {
  RefreshDevices();
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  families.push_back(OneSampleFamily(
      "gpucompute_host_kept_bytes",
      "Freed host memory kept as buffers for the next large tensors (operands, results, "
      "resident tensors on the CPU backend): part of --retain_host_memory_bytes.",
      prometheus::MetricType::Gauge,
      static_cast<double>(LargeStringCache::Default().kept_bytes())));
  // Without /proc (not Linux) the process families are left out.
  if (absl::StatusOr<ProcessStats> process = ReadProcessStats(); process.ok()) {
    using prometheus::MetricType;
    families.push_back(OneSampleFamily("process_cpu_seconds_total",
                                       "Total user and system CPU time spent in seconds.",
                                       MetricType::Counter, process->cpu_seconds));
    families.push_back(OneSampleFamily("process_resident_memory_bytes",
                                       "Resident memory size in bytes.", MetricType::Gauge,
                                       static_cast<double>(process->resident_bytes)));
    families.push_back(OneSampleFamily("process_virtual_memory_bytes",
                                       "Virtual memory size in bytes.", MetricType::Gauge,
                                       static_cast<double>(process->virtual_bytes)));
    families.push_back(OneSampleFamily("process_start_time_seconds",
                                       "Start time of the process since unix epoch in seconds.",
                                       MetricType::Gauge, process->start_time_seconds));
    families.push_back(OneSampleFamily("process_open_fds", "Number of open file descriptors.",
                                       MetricType::Gauge, static_cast<double>(process->open_fds)));
    families.push_back(OneSampleFamily("process_max_fds",
                                       "Maximum number of open file descriptors.",
                                       MetricType::Gauge, static_cast<double>(process->max_fds)));
  }
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::SetDeviceRefresh(std::function<std::vector<DeviceState>()> refresh) {
  absl::MutexLock lock(&refresh_mu_);
  refresh_ = std::move(refresh);
}

void Metrics::EnableTokenMetrics(size_t tokens) {
  auto& refused = prometheus::BuildCounter()
                      .Name("gpucompute_auth_refused_total")
                      .Help(
                          "Calls refused UNAUTHENTICATED before any handler, by reason: "
                          "missing (no authorization metadata), malformed (not \"Bearer "
                          "<token>\"), invalid (unknown or revoked token).")
                      .Register(*registry_);
  auth_missing_ = &refused.Add({{"reason", "missing"}});
  auth_malformed_ = &refused.Add({{"reason", "malformed"}});
  auth_invalid_ = &refused.Add({{"reason", "invalid"}});
  auto& reloads = prometheus::BuildCounter()
                      .Name("gpucompute_token_reloads_total")
                      .Help(
                          "Readings of --token_file after the first (SIGHUP or a change), by "
                          "result: ok, or error (the tokens in force stay).")
                      .Register(*registry_);
  token_reloads_ok_ = &reloads.Add({{"result", "ok"}});
  token_reloads_error_ = &reloads.Add({{"result", "error"}});
  bearer_tokens_ = &prometheus::BuildGauge()
                        .Name("gpucompute_bearer_tokens")
                        .Help("Bearer tokens in force (--token_file).")
                        .Register(*registry_)
                        .Add({});
  bearer_tokens_->Set(static_cast<double>(tokens));
}

void Metrics::AuthRefused(absl::string_view reason) {
  prometheus::Counter* counter = reason == "missing"     ? auth_missing_
                                 : reason == "malformed" ? auth_malformed_
                                 : reason == "invalid"   ? auth_invalid_
                                                         : nullptr;
  if (counter != nullptr) counter->Increment();
}

void Metrics::TokensReloaded(bool ok, size_t tokens) {
  if (bearer_tokens_ == nullptr) return;
  (ok ? token_reloads_ok_ : token_reloads_error_)->Increment();
  bearer_tokens_->Set(static_cast<double>(tokens));
}

void Metrics::SetExpirationsSource(std::function<int64_t()> expirations) {
  absl::MutexLock lock(&refresh_mu_);
  expirations_source_ = std::move(expirations);
}

void Metrics::ObserveStage(absl::string_view stage, double seconds) {
  absl::MutexLock lock(&mu_);
  auto it = stage_histograms_.find(stage);
  if (it != stage_histograms_.end()) it->second->Observe(seconds);
}

void Metrics::ObserveStages(const StageSeconds& stages) {
  ObserveStage("queue", stages.queue);
  ObserveStage("decode", stages.decode);
  if (stages.host_to_device > 0) ObserveStage("host_to_device", stages.host_to_device);
  if (stages.kernel > 0) ObserveStage("kernel", stages.kernel);
  if (stages.device_to_host > 0) ObserveStage("device_to_host", stages.device_to_host);
  ObserveStage("encode", stages.encode);
}

void Metrics::RefreshDevices() const {
  std::vector<DeviceState> states;
  {
    absl::MutexLock lock(&refresh_mu_);
    if (expirations_source_) {
      const int64_t total = expirations_source_();
      if (total > expirations_seen_) expirations_->Increment(double(total - expirations_seen_));
      expirations_seen_ = std::max(expirations_seen_, total);
    }
    if (!refresh_) return;
    states = refresh_();
  }
  absl::MutexLock lock(&mu_);
  for (const DeviceState& state : states) {
    auto it = device_gauges_.find(state.index);
    if (it == device_gauges_.end()) continue;
    const DeviceGauges& gauges = it->second;
    gauges.memory_used->Set(static_cast<double>(state.memory_used_bytes));
    gauges.memory_total->Set(static_cast<double>(state.memory_total_bytes));
    gauges.inflight_shards->Set(state.inflight_shards);
    gauges.inflight_bytes->Set(static_cast<double>(state.inflight_bytes));
    gauges.healthy->Set(state.healthy ? 1 : 0);
    gauges.resident_bytes->Set(static_cast<double>(state.resident_bytes));
    gauges.resident_tensors->Set(static_cast<double>(state.resident_tensors));
    gauges.resident_cap->Set(static_cast<double>(state.resident_cap_bytes));
  }
}

void Metrics::AddMethod(absl::string_view method) {
  RequestCounter(method, absl::StatusCode::kOk);
  RequestHistogram(method);
}

void Metrics::SetDevices(absl::Span<const DeviceDescription> devices) {
  for (const DeviceDescription& device : devices) {
    const std::string index = std::to_string(device.index);
    // GPUs carry the DCGM exporter's identity labels (CPU devices have none).
    prometheus::Labels info = {{"device", index}, {"kind", device.kind}, {"name", device.name}};
    if (!device.uuid.empty()) info["UUID"] = device.uuid;
    if (!device.pci_bus_id.empty()) info["pci_bus_id"] = device.pci_bus_id;
    device_info_.Add(info).Set(1);
    for (int peer : device.peers) {
      device_peer_access_.Add({{"device", index}, {"peer", std::to_string(peer)}}).Set(1);
    }
    Transfers(device.index);
    absl::MutexLock lock(&mu_);
    for (OpKind op : kAllOps) {
      KernelCounter(kernel_bytes_, kernel_bytes_series_, op, device.index);
      KernelCounter(kernel_flops_, kernel_flops_series_, op, device.index);
    }
    if (!device_gauges_.contains(device.index)) {
      DeviceGauges gauges;
      gauges.memory_used = &device_memory_used_.Add({{"device", index}});
      gauges.memory_total = &device_memory_total_.Add({{"device", index}});
      gauges.inflight_shards = &device_inflight_shards_.Add({{"device", index}});
      gauges.inflight_bytes = &device_inflight_bytes_.Add({{"device", index}});
      gauges.healthy = &device_healthy_.Add({{"device", index}});
      gauges.resident_bytes = &resident_bytes_.Add({{"device", index}});
      gauges.resident_tensors = &resident_tensors_.Add({{"device", index}});
      gauges.resident_cap = &resident_cap_.Add({{"device", index}});
      gauges.memory_total->Set(static_cast<double>(device.memory_bytes));
      gauges.healthy->Set(1);
      device_gauges_[device.index] = gauges;
    }
  }
}

void Metrics::RequestStarted() { inflight_requests_->Increment(); }

void Metrics::RequestFinished(absl::string_view method, absl::StatusCode code, double seconds) {
  inflight_requests_->Decrement();
  ItemFinished(method, code, seconds);
}

void Metrics::ItemFinished(absl::string_view method, absl::StatusCode code, double seconds) {
  RequestCounter(method, code).Increment();
  RequestHistogram(method).Observe(seconds);
}

void Metrics::OnShard(OpKind op, DType dtype, const DeviceDescription& device,
                      const ShardTiming& shard) {
  const ShardRun& run = shard.run;
  KernelHistogram(op, run.variant, device.index, dtype).Observe(run.kernel_seconds);
  const TransferSeries transfers = Transfers(device.index);
  if (run.h2d_seconds > 0) transfers.h2d_seconds->Observe(run.h2d_seconds);
  if (run.d2h_seconds > 0) transfers.d2h_seconds->Observe(run.d2h_seconds);
  transfers.h2d_bytes->Increment(run.h2d_bytes);
  transfers.d2h_bytes->Increment(run.d2h_bytes);
  absl::MutexLock lock(&mu_);
  KernelCounter(kernel_bytes_, kernel_bytes_series_, op, device.index).Increment(shard.work.bytes);
  KernelCounter(kernel_flops_, kernel_flops_series_, op, device.index).Increment(shard.work.flops);
}

prometheus::Counter& Metrics::RequestCounter(absl::string_view method, absl::StatusCode code) {
  const std::string code_name = absl::StatusCodeToString(code);
  const std::string key = absl::StrCat(method, std::string(1, kSep), code_name);
  absl::MutexLock lock(&mu_);
  prometheus::Counter*& counter = request_counters_[key];
  if (counter == nullptr) {
    counter = &requests_.Add({{"method", std::string(method)}, {"code", code_name}});
  }
  return *counter;
}

prometheus::Histogram& Metrics::RequestHistogram(absl::string_view method) {
  absl::MutexLock lock(&mu_);
  prometheus::Histogram*& histogram = request_histograms_[method];
  if (histogram == nullptr) {
    histogram = &request_duration_.Add({{"method", std::string(method)}}, RequestBuckets());
  }
  return *histogram;
}

prometheus::Histogram& Metrics::KernelHistogram(OpKind op, absl::string_view variant, int device,
                                                DType dtype) {
  const std::string key =
      absl::StrCat(static_cast<int>(op), std::string(1, kSep), variant, std::string(1, kSep),
                   device, std::string(1, kSep), static_cast<int>(dtype));
  absl::MutexLock lock(&mu_);
  prometheus::Histogram*& histogram = kernel_histograms_[key];
  if (histogram == nullptr) {
    histogram = &kernel_duration_.Add({{"op", std::string(OpName(op))},
                                       {"variant", std::string(variant)},
                                       {"device", std::to_string(device)},
                                       {"dtype", std::string(DTypeName(dtype))}},
                                      KernelBuckets());
  }
  return *histogram;
}

prometheus::Counter& Metrics::KernelCounter(
    prometheus::Family<prometheus::Counter>& family,
    absl::flat_hash_map<std::string, prometheus::Counter*>& cache, OpKind op, int device) {
  prometheus::Counter*& counter =
      cache[absl::StrCat(static_cast<int>(op), std::string(1, kSep), device)];
  if (counter == nullptr) {
    counter = &family.Add({{"op", std::string(OpName(op))}, {"device", std::to_string(device)}});
  }
  return *counter;
}

Metrics::TransferSeries Metrics::Transfers(int device) {
  absl::MutexLock lock(&mu_);
  auto it = transfer_series_.find(device);
  if (it != transfer_series_.end()) return it->second;
  const std::string index = std::to_string(device);
  TransferSeries series;
  series.h2d_seconds =
      &transfer_duration_.Add({{"device", index}, {"direction", kHostToDevice}}, KernelBuckets());
  series.d2h_seconds =
      &transfer_duration_.Add({{"device", index}, {"direction", kDeviceToHost}}, KernelBuckets());
  series.h2d_bytes = &transfer_bytes_.Add({{"device", index}, {"direction", kHostToDevice}});
  series.d2h_bytes = &transfer_bytes_.Add({{"device", index}, {"direction", kDeviceToHost}});
  transfer_series_[device] = series;
  return series;
}

}  // namespace gpucompute
