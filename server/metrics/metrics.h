// Prometheus metrics: one class owns the registry and builds every family
// once; the service and the engine record through it. Names follow the
// Prometheus conventions (gpucompute_ prefix, base units, _total counters)
// and pass `promtool check metrics`.
#ifndef GPUCOMPUTE_SERVER_METRICS_METRICS_H_
#define GPUCOMPUTE_SERVER_METRICS_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
#include "server/engine/engine.h"

namespace gpucompute {

class HttpEndpoint;

// One device's live state, read by the server at each scrape.
struct DeviceState {
  int index = 0;  // DeviceDescription::index
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;
  int inflight_shards = 0;
  int64_t inflight_bytes = 0;  // bytes of the shards admitted to it
  bool healthy = true;
  int64_t resident_bytes = 0;      // resident tensors and replicas in its memory
  int64_t resident_tensors = 0;    // resident tensors (replicas not counted)
  int64_t resident_cap_bytes = 0;  // --resident_max_bytes_per_device; 0: none
};

// Where one request's time went (Timings in the response), in seconds.
struct StageSeconds {
  double queue = 0;
  double decode = 0;
  double host_to_device = 0;
  double kernel = 0;
  double device_to_host = 0;
  double encode = 0;
};

// Every family the server exports:
//   gpucompute_requests_total{method,code}                 counter
//   gpucompute_request_duration_seconds{method}            histogram
//   gpucompute_kernel_duration_seconds{op,variant,device,dtype}  histogram
//   gpucompute_kernel_bytes_total{op,device}               counter
//   gpucompute_kernel_flops_total{op,device}               counter
//   gpucompute_received_bytes_total, gpucompute_sent_bytes_total  counters
//   gpucompute_inflight_requests, gpucompute_inflight_bytes,
//   gpucompute_queue_depth                                 gauges
//   gpucompute_transfer_duration_seconds{device,direction} histogram
//   gpucompute_transfer_bytes_total{device,direction}      counter
//     (direction: host_to_device, device_to_host)
//   gpucompute_device_info{device,kind,name,UUID,pci_bus_id} = 1  gauge
//     (GPUs also carry UUID and pci_bus_id, as the DCGM exporter labels
//     its series, for joins: on (UUID) or on (pci_bus_id))
//   gpucompute_device_memory_used_bytes{device},
//   gpucompute_device_memory_total_bytes{device},
//   gpucompute_device_inflight_shards{device},
//   gpucompute_device_inflight_bytes{device},
//   gpucompute_device_healthy{device} (1/0)                gauges, at scrape
//   gpucompute_device_peer_access{device,peer} = 1         gauge (topology)
//   gpucompute_stage_duration_seconds{stage}               histogram
//     (stage: queue, decode, receive, host_to_device, kernel,
//     device_to_host, encode, send)
//   gpucompute_resident_bytes{device},
//   gpucompute_resident_tensors{device},
//   gpucompute_resident_cap_bytes{device}                  gauges, at scrape
//   gpucompute_uploaded_bytes_total,
//   gpucompute_downloaded_bytes_total,
//   gpucompute_resident_expirations_total                  counters
//   gpucompute_request_arena_bytes_total{result}           counter
//     (result: staged, missed: bytes of request tensors of 1 MiB and more
//     decoded into the request arena, or into ordinary memory for want of
//     room there; only with --request_staging_bytes)
//   gpucompute_queue_duration_seconds                      histogram
//   gpucompute_build_info{version,revision,compiler,cuda} = 1  gauge
//   process_cpu_seconds_total, process_resident_memory_bytes,
//   process_virtual_memory_bytes, process_open_fds, process_max_fds,
//   process_start_time_seconds                             read at scrape,
//     named as Prometheus's client libraries name them
// Kernel, transfer and stage histograms have buckets from 1 us to 10 s;
// request and queue histograms up to 60 s.
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
  // /metrics returns), after refreshing the per-device gauges.
  std::string Scrape() const;

  // Creates the per-method series (so that they are exported before the
  // first request) for a method name such as "Gemm".
  void AddMethod(absl::string_view method);

  // Exports gpucompute_device_info and the peer pairs of `devices`, and
  // creates their other series: kernel bytes and FLOPs for every operation,
  // transfers in both directions, and the per-device gauges (memory total
  // from the description, nothing used or in flight, healthy) until the
  // first refresh.
  void SetDevices(absl::Span<const DeviceDescription> devices);

  // Every Scrape() calls `refresh` and sets the per-device gauges from what
  // it returns; states of devices SetDevices did not list are ignored.
  // `refresh` runs on the scraping thread, one call at a time, and must not
  // call into this object. Replacing it (nullptr: no refresh) waits for a
  // call in progress, so that the owner of what it reads can clear it before
  // destroying that.
  void SetDeviceRefresh(std::function<std::vector<DeviceState>()> refresh);

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

  // One request's stages (a device stage of 0 is not observed: nothing ran
  // there), or one stage of a stream ("receive", "send", ...).
  void ObserveStages(const StageSeconds& stages);
  void ObserveStage(absl::string_view stage, double seconds);
  // An operation waited `seconds` from acceptance until it started: for a
  // worker, for admission (--max_inflight_bytes) and for its devices' room;
  // also observed when it gave up waiting (RESOURCE_EXHAUSTED, deadline).
  void ObserveQueue(double seconds) { queue_duration_->Observe(seconds); }
  // Resident tensors' bytes moved by Upload and Download streams.
  void AddUploadedBytes(int64_t bytes) { uploaded_bytes_->Increment(static_cast<double>(bytes)); }
  void AddDownloadedBytes(int64_t bytes) {
    downloaded_bytes_->Increment(static_cast<double>(bytes));
  }
  // Bytes of large request tensors decoded into the request arena
  // (`staged`) and, for want of room there, into ordinary memory (`missed`).
  void AddStagedBytes(int64_t staged, int64_t missed) {
    if (staged > 0) arena_staged_bytes_->Increment(static_cast<double>(staged));
    if (missed > 0) arena_missed_bytes_->Increment(static_cast<double>(missed));
  }
  // Every Scrape() reads the total of expired resident tensors from
  // `expirations` (monotonic) into gpucompute_resident_expirations_total.
  void SetExpirationsSource(std::function<int64_t()> expirations);

  // Bearer-token metrics, for a server with a token file: creates
  // gpucompute_auth_refused_total{reason} (missing, malformed, invalid),
  // gpucompute_token_reloads_total{result} (ok, error) and
  // gpucompute_bearer_tokens (set to `tokens`). Call once, before serving;
  // without it the two calls below do nothing.
  void EnableTokenMetrics(size_t tokens);
  // A call refused for its token; `reason` as above (others are ignored).
  void AuthRefused(absl::string_view reason);
  // The token file was read again: `ok`, and the tokens now in force.
  void TokensReloaded(bool ok, size_t tokens);

  // ShardObserver: kernel duration, bytes and FLOPs of one shard, and its
  // transfers (a direction's duration is observed only when it is > 0).
  void OnShard(OpKind op, DType dtype, const DeviceDescription& device,
               const ShardTiming& shard) override;

 private:
  prometheus::Counter& RequestCounter(absl::string_view method, absl::StatusCode code);
  prometheus::Histogram& RequestHistogram(absl::string_view method);
  prometheus::Histogram& KernelHistogram(OpKind op, absl::string_view variant, int device,
                                         DType dtype);
  prometheus::Counter& KernelCounter(prometheus::Family<prometheus::Counter>& family,
                                     absl::flat_hash_map<std::string, prometheus::Counter*>& cache,
                                     OpKind op, int device);

  // A device's transfer series, by direction.
  struct TransferSeries {
    prometheus::Histogram* h2d_seconds;
    prometheus::Histogram* d2h_seconds;
    prometheus::Counter* h2d_bytes;
    prometheus::Counter* d2h_bytes;
  };
  // A device's gauges that the refresh sets.
  struct DeviceGauges {
    prometheus::Gauge* memory_used;
    prometheus::Gauge* memory_total;
    prometheus::Gauge* inflight_shards;
    prometheus::Gauge* inflight_bytes;
    prometheus::Gauge* healthy;
    prometheus::Gauge* resident_bytes;
    prometheus::Gauge* resident_tensors;
    prometheus::Gauge* resident_cap;
  };
  TransferSeries Transfers(int device);
  void RefreshDevices() const;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<HttpEndpoint> endpoint_;  // serves Scrape() over HTTP
  int port_ = 0;

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Histogram>& kernel_duration_;
  prometheus::Family<prometheus::Counter>& kernel_bytes_;
  prometheus::Family<prometheus::Counter>& kernel_flops_;
  prometheus::Family<prometheus::Histogram>& transfer_duration_;
  prometheus::Family<prometheus::Counter>& transfer_bytes_;
  prometheus::Family<prometheus::Gauge>& device_info_;
  prometheus::Family<prometheus::Gauge>& device_memory_used_;
  prometheus::Family<prometheus::Gauge>& device_memory_total_;
  prometheus::Family<prometheus::Gauge>& device_inflight_shards_;
  prometheus::Family<prometheus::Gauge>& device_inflight_bytes_;
  prometheus::Family<prometheus::Gauge>& device_healthy_;
  prometheus::Family<prometheus::Gauge>& device_peer_access_;
  prometheus::Family<prometheus::Histogram>& stage_duration_;
  prometheus::Family<prometheus::Gauge>& resident_bytes_;
  prometheus::Family<prometheus::Gauge>& resident_tensors_;
  prometheus::Family<prometheus::Gauge>& resident_cap_;
  prometheus::Histogram* queue_duration_;
  prometheus::Counter* uploaded_bytes_;
  prometheus::Counter* downloaded_bytes_;
  prometheus::Counter* expirations_;
  prometheus::Counter* arena_staged_bytes_;
  prometheus::Counter* arena_missed_bytes_;
  prometheus::Counter* received_bytes_;
  prometheus::Counter* sent_bytes_;
  prometheus::Gauge* inflight_requests_;
  prometheus::Gauge* inflight_bytes_;
  prometheus::Gauge* queue_depth_;
  // Set by EnableTokenMetrics before serving, read-only after.
  prometheus::Counter* auth_missing_ = nullptr;
  prometheus::Counter* auth_malformed_ = nullptr;
  prometheus::Counter* auth_invalid_ = nullptr;
  prometheus::Counter* token_reloads_ok_ = nullptr;
  prometheus::Counter* token_reloads_error_ = nullptr;
  prometheus::Gauge* bearer_tokens_ = nullptr;

  // Series by label values, so that each is built once.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, prometheus::Counter*> request_counters_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Histogram*> request_histograms_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Histogram*> kernel_histograms_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Counter*> kernel_bytes_series_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Counter*> kernel_flops_series_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, TransferSeries> transfer_series_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, DeviceGauges> device_gauges_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Histogram*> stage_histograms_ ABSL_GUARDED_BY(mu_);
  std::function<int64_t()> expirations_source_ ABSL_GUARDED_BY(refresh_mu_);
  mutable int64_t expirations_seen_ ABSL_GUARDED_BY(refresh_mu_) = 0;

  // Held while `refresh_` runs (never together with mu_).
  mutable absl::Mutex refresh_mu_;
  std::function<std::vector<DeviceState>()> refresh_ ABSL_GUARDED_BY(refresh_mu_);
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_METRICS_METRICS_H_
