// Prometheus metrics: one class owns the registry and builds every family
// once; the service and the engine record through it. Names follow the
// Prometheus conventions (gpucompute_ prefix, base units, _total counters)
// and pass `promtool check metrics`.
#ifndef GPUCOMPUTE_SERVER_METRICS_METRICS_H_
#define GPUCOMPUTE_SERVER_METRICS_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/core/engine.h"

namespace gpucompute {

class HttpEndpoint;

// Every family the server exports:
//   gpucompute_requests_total{method,code}                 counter
//   gpucompute_request_duration_seconds{method}            histogram
//   gpucompute_kernel_duration_seconds{op,variant,device,dtype}  histogram
//   gpucompute_kernel_bytes_total{op,device}               counter
//   gpucompute_kernel_flops_total{op,device}               counter
//   gpucompute_received_bytes_total, gpucompute_sent_bytes_total  counters
//   gpucompute_inflight_requests, gpucompute_inflight_bytes,
//   gpucompute_queue_depth                                 gauges
//   gpucompute_device_info{device,kind,name} = 1           gauge
// Thread-safe.
class Metrics final : public ShardObserver {
 public:
  Metrics();
  ~Metrics() override;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Serves GET /metrics over HTTP on `listen` ("host:port"; port 0 picks a
  // free one). UNAVAILABLE when the address cannot be bound;
  // FAILED_PRECONDITION when already serving.
  absl::Status Serve(const std::string& listen);
  // The bound HTTP port, or 0 when not serving.
  int port() const { return port_; }

  // The current exposition in the Prometheus text format (what a scrape of
  // /metrics returns).
  std::string Scrape() const;

  // Creates the per-method series (so that they are exported before the
  // first request) for a method name such as "Gemm".
  void AddMethod(absl::string_view method);

  // Exports gpucompute_device_info for `devices` and creates their kernel
  // byte and FLOP series for every operation.
  void SetDevices(absl::Span<const DeviceDescription> devices);

  // A request was accepted / answered. `code` is the gRPC code it ended
  // with (absl and gRPC codes coincide); `seconds` its server time.
  void RequestStarted();
  void RequestFinished(absl::string_view method, absl::StatusCode code, double seconds);

  // Items of a batch stream count as requests of method "Batch/<Op>"
  // without touching gpucompute_inflight_requests (the stream counts once).
  void ItemFinished(absl::string_view method, absl::StatusCode code, double seconds);

  void AddReceivedBytes(int64_t bytes) { received_bytes_->Increment(static_cast<double>(bytes)); }
  void AddSentBytes(int64_t bytes) { sent_bytes_->Increment(static_cast<double>(bytes)); }
  // Gauges move by deltas (atomically), so concurrent updates never leave a
  // stale value behind.
  void AddQueueDepth(int64_t delta) { queue_depth_->Increment(static_cast<double>(delta)); }
  void AddInflightBytes(int64_t delta) { inflight_bytes_->Increment(static_cast<double>(delta)); }

  // ShardObserver: kernel duration, bytes and FLOPs of one shard.
  void OnShard(OpKind op, DType dtype, const DeviceDescription& device,
               const ShardRun& run) override;

 private:
  prometheus::Counter& RequestCounter(absl::string_view method, absl::StatusCode code);
  prometheus::Histogram& RequestHistogram(absl::string_view method);
  prometheus::Histogram& KernelHistogram(OpKind op, absl::string_view variant, int device,
                                         DType dtype);
  prometheus::Counter& KernelCounter(prometheus::Family<prometheus::Counter>& family,
                                     absl::flat_hash_map<std::string, prometheus::Counter*>& cache,
                                     OpKind op, int device);

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<HttpEndpoint> endpoint_;  // serves Scrape() over HTTP
  int port_ = 0;

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Histogram>& kernel_duration_;
  prometheus::Family<prometheus::Counter>& kernel_bytes_;
  prometheus::Family<prometheus::Counter>& kernel_flops_;
  prometheus::Family<prometheus::Gauge>& device_info_;
  prometheus::Counter* received_bytes_;
  prometheus::Counter* sent_bytes_;
  prometheus::Gauge* inflight_requests_;
  prometheus::Gauge* inflight_bytes_;
  prometheus::Gauge* queue_depth_;

  // Series by label values, so that each is built once.
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, prometheus::Counter*> request_counters_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Histogram*> request_histograms_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Histogram*> kernel_histograms_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Counter*> kernel_bytes_series_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Counter*> kernel_flops_series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_METRICS_METRICS_H_
