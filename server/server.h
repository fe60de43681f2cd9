// The gpucompute server: the Compute service plus health, reflection and
// metrics, over the devices of one backend.
#ifndef GPUCOMPUTE_SERVER_SERVER_H_
#define GPUCOMPUTE_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "server/backends.h"
#include "server/engine/admission.h"
#include "server/engine/engine.h"
#include "server/metrics/metrics.h"
#include "server/service/auth.h"
#include "server/service/compute_service.h"
#include "server/service/worker_pool.h"
#include "server/tls_files.h"

namespace gpucompute {

// Configuration; main.cc copies its flags in here.
struct ServerOptions {
  // gRPC address, "host:port"; port 0 picks a free one.
  std::string listen = "0.0.0.0:50051";
  // Prometheus /metrics address, "host:port" (port 0 picks one); empty
  // disables metrics serving.
  std::string metrics_listen = "0.0.0.0:9464";
  // "auto" (CUDA when a GPU is usable, else CPU), "cpu" or "cuda".
  std::string backend = "auto";
  // GPU ordinals to use (CUDA); empty = all.
  std::vector<int> devices;
  // Relative compute weights, one per device; empty = equal (CPU) or
  // measured (CUDA).
  std::vector<double> device_weights;
  // Virtual CPU devices of the CPU backend.
  int cpu_devices = 1;
  // Largest request or response message, bytes (at most 2^31 - 1).
  int64_t max_message_bytes = int64_t{1} << 30;
  // Admission limit on the host memory of the calls being served at once
  // (ComputeService: requests received and decoded, results, answers until
  // sent); 0 = no limit.
  int64_t max_inflight_bytes = int64_t{4} << 30;
  // Per device: bound on the bytes (inputs plus outputs) of the shards it
  // holds at once; 0 = no bound, -1 = automatic (three quarters of a GPU's
  // memory; no bound for CPU devices, which --max_inflight_bytes covers).
  int64_t device_max_inflight_bytes = -1;
  // Per device: bound on resident bytes (tensors and replicas); 0 = none,
  // -1 = automatic (half the device's memory).
  int64_t resident_max_bytes_per_device = -1;
  // Per client: bound on resident bytes; 0 = none.
  int64_t resident_quota_bytes = 0;
  // Per client: bound on resident tensors; 0 = none.
  int64_t resident_max_tensors = 100000;
  // A resident tensor unused this long expires; zero: never.
  absl::Duration resident_lease = absl::Hours(1);
  // Per GPU: pinned staging memory, allocated at start and split among the
  // GPU's lanes.
  int64_t pinned_staging_bytes = int64_t{256} << 20;
  // Per GPU: streams (lanes) that run shards at once, each with its share of
  // the pinned staging memory.
  int gpu_lanes = 8;
  // Per GPU: threads that copy to and from the pinned staging memory; 0 =
  // the host's cores shared among the GPUs, at most 8 each.
  int staging_copy_threads = 0;
  // Host memory allocated once at start that large operands of operation
  // requests (unary calls, Batch items) are decoded into: pinned on the CUDA backend, so they reach
  // the GPU by DMA alone; 0 = none, -1 = 1 GiB on the CUDA backend and none on the CPU backend.
  int64_t request_staging_bytes = -1;
  // Threads that run operations; 0 = twice the hardware threads (at least 4).
  int worker_threads = 0;
  // When set, {"grpc_port": N, "metrics_port": M} is written here (atomically,
  // by rename) once the server is serving; metrics_port is 0 when disabled.
  std::string ready_file;
  // How long Shutdown waits for calls in flight before stopping their
  // operations and cancelling them.
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // A Batch stream whose answer waits this long to be written (its client
  // does not read) is ended RESOURCE_EXHAUSTED; infinite: never.
  absl::Duration stalled_stream_timeout = absl::Seconds(30);
  // HTTP/2 keepalive: a connection idle this long gets a ping, and is closed
  // when no answer comes within keepalive_timeout (clients that vanished).
  // Clients may ping as often as every 10 s, also between calls.
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // A connection older than this (gRPC adds +-10% jitter) is sent GOAWAY:
  // its client reconnects and re-resolves, so that clients balancing over a
  // headless Service find pods added by a scale-up or a rollout. Calls in
  // flight on it may finish for max_connection_age_grace more (infinite:
  // always). Infinite max_connection_age: never.
  absl::Duration max_connection_age = absl::Minutes(5);
  absl::Duration max_connection_age_grace = absl::InfiniteDuration();

  // TLS on the gRPC port: PEM files of the server's certificate chain and
  // its private key, both or neither (neither: plaintext).
  std::string tls_cert_path;
  std::string tls_key_path;
  // With TLS: PEM file of the CA certificates that clients' certificates
  // must chain to. Set, every client must present a certificate that
  // verifies (mutual TLS), and its common name identifies the client.
  std::string tls_client_ca_path;
  // With TLS: the certificate, key and client CA files are read again this
  // often (and on ReloadTls(), SIGHUP), and new handshakes use what they then
  // hold (a rotation needs no restart; files that do not load, or a key that
  // is not the certificate's, leave the previous ones in use: see TlsFiles).
  // Zero: read once at start.
  absl::Duration tls_reload_interval = absl::Seconds(30);
  // With TLS: bearer tokens (format in server/service/auth.h). Set, every
  // call needs "authorization: Bearer <token>" metadata naming one of them,
  // and the token's identity owns the call's resident tensors. Read again on
  // ReloadTokens() (SIGHUP) and when the file changes.
  std::string token_file;
  // With token_file: grpc.health.v1.Health needs no token (probes).
  bool auth_exempt_health = true;
};

class Server {
 public:
  // Validates `options` and creates the devices, the engine and the
  // service; serves nothing yet. Errors: INVALID_ARGUMENT naming the flag,
  // FAILED_PRECONDITION for a backend this build or machine lacks, or the
  // backend's error.
  static absl::StatusOr<std::unique_ptr<Server>> Create(ServerOptions options);
  // The same over `devices` as given (the backend, device and weight options
  // are not used): for embedding the service over devices of one's own.
  // INVALID_ARGUMENT when `devices` is empty or a device's
  // description().index is not its position.
  static absl::StatusOr<std::unique_ptr<Server>> Create(ServerOptions options, DeviceSet devices);

  // Shuts down (see Shutdown) if still serving.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts serving: metrics, then gRPC (Compute, health,
  // reflection); marks health SERVING, writes the ready file and prints the
  // addresses to stderr. UNAVAILABLE when an address cannot be bound,
  // INTERNAL when the ready file cannot be written. Call once.
  absl::Status Start();

  // Blocks until Shutdown has finished (at once if never started or if
  // Start failed).
  void Wait();

  // Graceful shutdown: health NOT_SERVING (sent to every Watch), new
  // Compute calls answered UNAVAILABLE while those accepted finish; after
  // shutdown_timeout the operations left are stopped (CPU kernels between
  // blocks) and answered UNAVAILABLE and the calls left cancelled; then
  // every other call (health Watches, reflection) closed within a moment,
  // the workers stopped. Returns within shutdown_timeout and half a second
  // where no GPU kernel runs longer. Thread-safe and idempotent. REQUIRES:
  // not called from a gRPC callback, nor while Start is running.
  void Shutdown();

  // Reads the token file again. Returns the number of tokens now in force;
  // on error the tokens stay as they were. FAILED_PRECONDITION without
  // ServerOptions::token_file.
  absl::StatusOr<size_t> ReloadTokens();
  // Reads the TLS files again now (SIGHUP), as every tls_reload_interval
  // does: true when they changed (new connections get them); an error,
  // naming the flag, leaves the ones in use; FAILED_PRECONDITION without
  // TLS or with tls_reload_interval 0.
  absl::StatusOr<bool> ReloadTls();

  // Bound ports; 0 before Start (metrics: or when disabled).
  int port() const { return port_; }
  int metrics_port() const { return metrics_->port(); }

  Metrics& metrics() { return *metrics_; }
  // Where large request operands are decoded (--request_staging_bytes); null
  // when none.
  const HostArena* request_arena() const { return request_arena_.get(); }
  Engine& engine() { return *engine_; }

 private:
  explicit Server(ServerOptions options) : options_(std::move(options)) {}
  absl::Status StartServing();
  absl::Status WriteReadyFile() const;

  const ServerOptions options_;
  // Destroyed in reverse: the gRPC server first, the metrics last.
  std::unique_ptr<Metrics> metrics_;
  // Before engine_: the devices' shards copy from it, so it goes after them.
  std::unique_ptr<HostArena> request_arena_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<ComputeService> service_;
  // The TLS files' private copy, read by the gRPC server's credentials: it
  // outlives the gRPC server.
  std::unique_ptr<TlsFiles> tls_files_;
  std::unique_ptr<grpc::Server> grpc_server_;
  // The gRPC port's credentials (TLS files read at Create, and again every
  // tls_reload_interval when set) and
  // the token check they run, if any.
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::shared_ptr<TokenAuthenticator> authenticator_;
  int port_ = 0;

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stopped_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVER_H_
