// gpucompute-server: serves the Compute gRPC API (and Prometheus metrics)
// on the CUDA backend when a GPU is usable, else on the CPU backend.
// SIGTERM or SIGINT drain the calls in flight and exit 0; SIGHUP reads the
// --token_file and the TLS files again.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpc/grpc.h"
#include "proto/host_memory.h"
#include "server/server.h"

namespace {
const gpucompute::ServerOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, listen, kDefaults.listen, "gRPC address host:port (port 0 picks one)");
ABSL_FLAG(std::string, metrics_listen, kDefaults.metrics_listen,
          "Prometheus /metrics address host:port (port 0 picks one); empty disables");
ABSL_FLAG(std::string, backend, kDefaults.backend,
          "auto (CUDA when a GPU is usable, else CPU), cpu or cuda");
ABSL_FLAG(std::vector<std::string>, devices, {},
          "GPU ordinals to use, e.g. 0,1 (CUDA backend); empty = all");
ABSL_FLAG(std::vector<std::string>, device_weights, {},
          "relative compute weight per device, e.g. 1,1,2,2; empty = equal (CPU) or measured "
          "(CUDA)");
ABSL_FLAG(int, cpu_devices, kDefaults.cpu_devices,
          "number of virtual CPU devices of the CPU backend");
ABSL_FLAG(int64_t, max_message_bytes, kDefaults.max_message_bytes,
          "largest request or response message in bytes (at most 2147483647)");
ABSL_FLAG(int64_t, max_inflight_bytes, kDefaults.max_inflight_bytes,
          "admission limit on the host memory of the calls served at once (requests received "
          "and decoded, results, answers until sent; operations, Echo, Batch items, transfer "
          "chunks), taken before a request is received; 0 = no limit");
ABSL_FLAG(int64_t, device_max_inflight_bytes, kDefaults.device_max_inflight_bytes,
          "per device: bound on the bytes (inputs plus outputs) of the shards it holds at once; "
          "work over it waits; 0 = no bound, -1 = automatic (3/4 of a GPU's memory, none on CPU)");
ABSL_FLAG(int64_t, resident_max_bytes_per_device, kDefaults.resident_max_bytes_per_device,
          "per device: bound on the bytes of resident tensors (and their replicas) in its "
          "memory; over it an upload or kept result is refused; 0 = no bound, -1 = automatic "
          "(half the device's memory)");
ABSL_FLAG(int64_t, resident_quota_bytes, kDefaults.resident_quota_bytes,
          "per client (gpucompute-session, or its token's or certificate's identity): bound on the "
          "bytes of its resident tensors; "
          "0 = no quota");
ABSL_FLAG(int64_t, resident_max_tensors, kDefaults.resident_max_tensors,
          "per client: bound on its number of resident tensors; 0 = no bound");
ABSL_FLAG(absl::Duration, resident_lease, kDefaults.resident_lease,
          "a resident tensor unused for this long is freed (the backstop for clients that "
          "vanish); 0 = never");
ABSL_FLAG(int64_t, pinned_staging_bytes, kDefaults.pinned_staging_bytes,
          "per GPU: pinned host memory for staging copies, allocated once at start and split "
          "between the GPU's streams");
ABSL_FLAG(int, gpu_lanes, kDefaults.gpu_lanes,
          "per GPU: streams that run operations at once (1 to 64), each with its share of "
          "--pinned_staging_bytes; more run more small operations at once");
ABSL_FLAG(int, staging_copy_threads, kDefaults.staging_copy_threads,
          "per GPU: threads that copy between pageable host memory and the pinned staging "
          "buffers (0 to 64); 0 = the host's cores shared among the GPUs, at most 8 each");
ABSL_FLAG(int64_t, request_staging_bytes, kDefaults.request_staging_bytes,
          "host memory allocated once at start that large operands of operation requests (1 MiB "
          "and more) are decoded into: pinned on the CUDA backend, so they reach the GPU by DMA "
          "with no staging copy; a request that finds it full uses ordinary memory; 0 = none, "
          "-1 = 1 GiB on the CUDA backend and none on the CPU backend");
ABSL_FLAG(int64_t, retain_host_memory_bytes, INT32_MAX,
          "freed host memory kept for reuse, the allocator's (no mmap for large blocks) and "
          "the buffers of tensors of 8 MiB and more, so that large messages do not page-fault "
          "their buffers in again; more is given back within a second; 0 = the C library's "
          "defaults, and freed memory is given back within a second");
ABSL_FLAG(int, host_memory_arenas, 8,
          "with --retain_host_memory_bytes: heaps the allocator spreads threads over; more let "
          "many threads allocate at once (small requests at high rates); 1 keeps every freed "
          "block in one pool");
ABSL_FLAG(int, worker_threads, kDefaults.worker_threads,
          "threads running operations; 0 = twice the hardware threads (at least 4)");
ABSL_FLAG(std::string, ready_file, kDefaults.ready_file,
          "when set, {\"grpc_port\": N, \"metrics_port\": M} is written here once serving");
ABSL_FLAG(absl::Duration, shutdown_timeout, kDefaults.shutdown_timeout,
          "on SIGTERM/SIGINT, how long calls in flight may take before their operations are "
          "stopped (answered UNAVAILABLE) and they are cancelled; the process exits within this "
          "and half a second");
ABSL_FLAG(absl::Duration, stalled_stream_timeout, kDefaults.stalled_stream_timeout,
          "a Batch stream whose answer waits this long to be written, because its client does "
          "not read, is ended RESOURCE_EXHAUSTED and its unsent answers dropped; inf = never");

ABSL_FLAG(absl::Duration, keepalive_time, kDefaults.keepalive_time,
          "a connection idle this long is pinged, and closed when no answer comes within "
          "--keepalive_timeout");
ABSL_FLAG(absl::Duration, keepalive_timeout, kDefaults.keepalive_timeout,
          "how long a keepalive ping may go unanswered");
ABSL_FLAG(absl::Duration, max_connection_age, kDefaults.max_connection_age,
          "a connection older than this (+-10% jitter) is asked to go away, so that clients "
          "reconnect and find new replicas; inf = never");
ABSL_FLAG(absl::Duration, max_connection_age_grace, kDefaults.max_connection_age_grace,
          "how long calls in flight on a connection past --max_connection_age may go on; "
          "inf = until they finish");

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the server: serve TLS (with --tls_key); empty = plaintext");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates: every client must present a certificate that chains to them "
          "(mutual TLS; needs --tls_cert); its common name identifies the client");
ABSL_FLAG(absl::Duration, tls_reload_interval, kDefaults.tls_reload_interval,
          "with --tls_cert: read the certificate, key and client CA files again this often and "
          "on SIGHUP (new connections use them; a key that is not the certificate's keeps the "
          "previous pair); 0 = once at start");
ABSL_FLAG(std::string, token_file, "",
          "bearer tokens, one per line, each optionally followed by the identity it "
          "authenticates: every call needs \"authorization: Bearer <token>\" metadata (needs "
          "--tls_cert); read again on SIGHUP and when the file changes");
ABSL_FLAG(bool, auth_exempt_health, kDefaults.auth_exempt_health,
          "with --token_file: grpc.health.v1.Health needs no token (probes)");

namespace {

template <typename T, typename Parse>
absl::StatusOr<std::vector<T>> ParseList(const std::vector<std::string>& items, const char* flag,
                                         const char* what, Parse parse) {
  std::vector<T> values;
  for (const std::string& item : items) {
    T value;
    if (!parse(item, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", item, "\" is not ", what));
    }
    values.push_back(value);
  }
  return values;
}

absl::StatusOr<gpucompute::ServerOptions> OptionsFromFlags() {
  gpucompute::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.backend = absl::GetFlag(FLAGS_backend);
  absl::StatusOr<std::vector<int>> devices = ParseList<int>(
      absl::GetFlag(FLAGS_devices), "devices", "a device ordinal",
      [](const std::string& s, int* v) { return absl::SimpleAtoi(s, v) && *v >= 0; });
  if (!devices.ok()) return devices.status();
  options.devices = *std::move(devices);
  absl::StatusOr<std::vector<double>> weights =
      ParseList<double>(absl::GetFlag(FLAGS_device_weights), "device_weights", "a number",
                        [](const std::string& s, double* v) { return absl::SimpleAtod(s, v); });
  if (!weights.ok()) return weights.status();
  options.device_weights = *std::move(weights);
  options.cpu_devices = absl::GetFlag(FLAGS_cpu_devices);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  options.device_max_inflight_bytes = absl::GetFlag(FLAGS_device_max_inflight_bytes);
  options.resident_max_bytes_per_device = absl::GetFlag(FLAGS_resident_max_bytes_per_device);
  options.resident_quota_bytes = absl::GetFlag(FLAGS_resident_quota_bytes);
  options.resident_max_tensors = absl::GetFlag(FLAGS_resident_max_tensors);
  options.resident_lease = absl::GetFlag(FLAGS_resident_lease);
  options.pinned_staging_bytes = absl::GetFlag(FLAGS_pinned_staging_bytes);
  options.gpu_lanes = absl::GetFlag(FLAGS_gpu_lanes);
  options.staging_copy_threads = absl::GetFlag(FLAGS_staging_copy_threads);
  options.request_staging_bytes = absl::GetFlag(FLAGS_request_staging_bytes);
  options.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  options.ready_file = absl::GetFlag(FLAGS_ready_file);
  options.shutdown_timeout = absl::GetFlag(FLAGS_shutdown_timeout);
  options.stalled_stream_timeout = absl::GetFlag(FLAGS_stalled_stream_timeout);
  options.keepalive_time = absl::GetFlag(FLAGS_keepalive_time);
  options.keepalive_timeout = absl::GetFlag(FLAGS_keepalive_timeout);
  options.max_connection_age = absl::GetFlag(FLAGS_max_connection_age);
  options.max_connection_age_grace = absl::GetFlag(FLAGS_max_connection_age_grace);
  options.tls_cert_path = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_path = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca_path = absl::GetFlag(FLAGS_tls_client_ca);
  options.tls_reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  options.token_file = absl::GetFlag(FLAGS_token_file);
  options.auth_exempt_health = absl::GetFlag(FLAGS_auth_exempt_health);
  return options;
}

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int signal) {
  const unsigned char byte = static_cast<unsigned char>(signal);
  const int saved_errno = errno;
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &byte, 1);
  errno = saved_errno;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "gpucompute-server: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gpucompute-server [flags]: GEMM, GEMV, reduce, transpose and attention over gRPC");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("unexpected argument \"", positional[1], "\" (flags only)")));
  }
  // Debian's abseil is built with mutex deadlock detection on, which records
  // every lock in one process-wide graph under a global lock: a fifth of the
  // server's CPU time for a stream of small items, and a point where every
  // thread queues. Off, as in release builds of abseil.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Before any thread of ours (or gRPC's) allocates.
  if (absl::Status status = gpucompute::KeepFreedHostMemory(
          absl::GetFlag(FLAGS_retain_host_memory_bytes), absl::GetFlag(FLAGS_host_memory_arenas));
      absl::IsInvalidArgument(status)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--retain_host_memory_bytes, --host_memory_arenas: ", status.message())));
  } else if (!status.ok()) {
    std::fprintf(stderr, "gpucompute-server: %s; going on with the allocator as it is\n",
                 status.ToString().c_str());
  }
  // The retention above is a bound: freed memory beyond it goes back to the
  // system within a second.
  gpucompute::HostMemoryTrimmer trimmer(absl::GetFlag(FLAGS_retain_host_memory_bytes));

  // SIGTERM, SIGINT and SIGHUP only wake a thread of ours through a pipe
  // (the handler does nothing else, so it is async-signal-safe); that
  // thread starts the drain or reloads the tokens. Blocking the signals instead would not do:
  // libraries (OpenBLAS) start threads before main that would still take them.
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    return Fail(absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno))));
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGTERM, &action, nullptr) != 0 || sigaction(SIGINT, &action, nullptr) != 0 ||
      sigaction(SIGHUP, &action, nullptr) != 0) {
    return Fail(absl::InternalError(absl::StrCat("sigaction: ", std::strerror(errno))));
  }

  // A gRPC library reference held for the life of the process: without it,
  // destroying the last grpc::Server runs grpc_shutdown, which waits up to
  // 10 s for gRPC's backup TCP poller to wake. Process exit reclaims it all.
  grpc_init();

  absl::StatusOr<gpucompute::ServerOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  absl::StatusOr<std::unique_ptr<gpucompute::Server>> server =
      gpucompute::Server::Create(*std::move(options));
  if (!server.ok()) return Fail(server.status());
  if (absl::Status status = (*server)->Start(); !status.ok()) return Fail(status);

  std::thread signal_thread([s = server->get()] {
    unsigned char signal = 0;
    while (true) {
      const ssize_t n = read(g_signal_pipe[0], &signal, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1 || signal != SIGHUP) break;
      absl::StatusOr<size_t> tokens = s->ReloadTokens();
      if (tokens.ok()) {
        std::fprintf(stderr, "gpucompute-server: SIGHUP, token file read: %zu tokens\n", *tokens);
      } else {
        std::fprintf(stderr, "gpucompute-server: SIGHUP: %s; the tokens stay as they were\n",
                     tokens.status().ToString().c_str());
      }
      absl::StatusOr<bool> tls = s->ReloadTls();
      if (tls.ok()) {
        std::fprintf(stderr, "gpucompute-server: SIGHUP, TLS files read: %s\n",
                     *tls ? "changed, new connections get them" : "unchanged");
      } else if (tls.status().code() != absl::StatusCode::kFailedPrecondition) {
        std::fprintf(stderr, "gpucompute-server: SIGHUP: %s; the previous TLS files stay in use\n",
                     tls.status().ToString().c_str());
      }
    }
    std::fprintf(stderr, "gpucompute-server: %s, draining calls in flight\n",
                 signal == SIGTERM ? "SIGTERM" : "SIGINT");
    s->Shutdown();
  });
  (*server)->Wait();
  signal_thread.join();
  std::fprintf(stderr, "gpucompute-server: stopped\n");
  return 0;
}
