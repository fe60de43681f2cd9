#include "server/metrics/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/metrics/http_endpoint.h"
#include "prometheus/text_serializer.h"

namespace gpucompute {
namespace {

// Request latency: 100 us to 60 s.
const prometheus::Histogram::BucketBoundaries& RequestBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
      0.1,  0.25,   0.5,  1,    2.5,    5,    10,   30,     60};
  return *buckets;
}

// Kernel time: 10 us to 10 s.
const prometheus::Histogram::BucketBoundaries& KernelBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
      1e-2, 2.5e-2, 5e-2, 0.1,  0.25,   0.5,  1,    2.5,    10};
  return *buckets;
}

// The separator cannot occur in label values we build keys from (method
// names, variant names, codes).
constexpr char kSep = '\x1f';

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
      device_info_(prometheus::BuildGauge()
                       .Name("gpucompute_device_info")
                       .Help("Compute devices of this server (value 1).")
                       .Register(*registry_)) {
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
                             "Bytes held by admitted requests (inputs plus outputs), "
                             "limited by --max_inflight_bytes.")
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
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void Metrics::AddMethod(absl::string_view method) {
  RequestCounter(method, absl::StatusCode::kOk);
  RequestHistogram(method);
}

void Metrics::SetDevices(absl::Span<const DeviceDescription> devices) {
  for (const DeviceDescription& device : devices) {
    device_info_
        .Add({{"device", std::to_string(device.index)},
              {"kind", device.kind},
              {"name", device.name}})
        .Set(1);
    absl::MutexLock lock(&mu_);
    for (OpKind op : kAllOps) {
      KernelCounter(kernel_bytes_, kernel_bytes_series_, op, device.index);
      KernelCounter(kernel_flops_, kernel_flops_series_, op, device.index);
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
                      const ShardRun& run) {
  KernelHistogram(op, run.variant, device.index, dtype).Observe(run.kernel_seconds);
  absl::MutexLock lock(&mu_);
  KernelCounter(kernel_bytes_, kernel_bytes_series_, op, device.index).Increment(run.bytes);
  KernelCounter(kernel_flops_, kernel_flops_series_, op, device.index).Increment(run.flops);
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

}  // namespace gpucompute
