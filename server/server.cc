#include "server/server.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/server_builder.h"
#include "server/backends.h"
#include "server/common/status_macros.h"
#include "server/tls_files.h"

namespace gpucompute {
namespace {

// Room left in a response message for everything but the result tensors.
constexpr int64_t kResponseEnvelopeBytes = 64 << 10;

constexpr char kServiceName[] = "gpucompute.v1.Compute";

// At shutdown, once the Compute calls are done: how long the calls left
// (health Watches, reflection, calls just refused) have to finish before
// they are cancelled. Long enough for an answer already written to leave.
constexpr absl::Duration kCloseGrace = absl::Milliseconds(250);

// At shutdown, when operations still run at the timeout: how long they have
// to stop (CPU kernels between blocks) and their UNAVAILABLE answers to
// leave before every call is cancelled. With the rest of the shutdown it
// stays within the half second the timeout is promised to be kept to.
constexpr absl::Duration kStopGrace = absl::Milliseconds(200);

absl::Status CheckOptions(const ServerOptions& options) {
  if (options.listen.empty()) {
    return absl::InvalidArgumentError("--listen: expected host:port but got an empty address");
  }
  if (options.max_message_bytes <= kResponseEnvelopeBytes || options.max_message_bytes > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("--max_message_bytes: expected a value in (",
                                                   kResponseEnvelopeBytes, ", ", INT_MAX,
                                                   "] but got ", options.max_message_bytes));
  }
  if (options.max_inflight_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_inflight_bytes: expected >= 0 (0 = no limit) but got ", options.max_inflight_bytes));
  }
  if (options.device_max_inflight_bytes < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device_max_inflight_bytes: expected >= -1 (0 = no bound, -1 = automatic) "
                     "but got ",
                     options.device_max_inflight_bytes));
  }
  if (options.worker_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--worker_threads: expected >= 0 (0 = automatic) but got ", options.worker_threads));
  }
  if (options.resident_max_bytes_per_device < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--resident_max_bytes_per_device: expected >= -1 (0 = no bound, -1 = automatic) but got ",
        options.resident_max_bytes_per_device));
  }
  if (options.resident_quota_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--resident_quota_bytes: expected >= 0 (0 = no quota) but got ",
                     options.resident_quota_bytes));
  }
  if (options.resident_max_tensors < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--resident_max_tensors: expected >= 0 (0 = no bound) but got ",
                     options.resident_max_tensors));
  }
  if (options.resident_lease < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--resident_lease: expected >= 0 (0 = never)");
  }
  if (options.shutdown_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("shutdown_timeout: expected >= 0");
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, absl::Duration>{"keepalive_time", options.keepalive_time},
        {"keepalive_timeout", options.keepalive_timeout},
        {"max_connection_age", options.max_connection_age},
        {"max_connection_age_grace", options.max_connection_age_grace},
        {"stalled_stream_timeout", options.stalled_stream_timeout}}) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, ": expected > 0 (inf: never) but got ", absl::FormatDuration(value)));
    }
  }
  if (options.tls_cert_path.empty() != options.tls_key_path.empty()) {
    return absl::InvalidArgumentError("--tls_cert, --tls_key: give both (TLS) or neither");
  }
  if (options.tls_cert_path.empty() && !options.tls_client_ca_path.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca: mutual TLS needs TLS (--tls_cert and --tls_key)");
  }
  if (options.tls_reload_interval < absl::ZeroDuration() ||
      (options.tls_reload_interval > absl::ZeroDuration() &&
       options.tls_reload_interval < absl::Seconds(1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_reload_interval: expected 0 (never) or at least 1s but got ",
                     absl::FormatDuration(options.tls_reload_interval)));
  }
  if (options.tls_cert_path.empty() && !options.token_file.empty()) {
    return absl::InvalidArgumentError(
        "--token_file: bearer tokens are accepted over TLS only (--tls_cert and --tls_key)");
  }
  return absl::OkStatus();
}

// The gRPC port's credentials: plaintext, TLS, or mutual TLS (client
// certificates required and verified), with `authenticator` checking every
// call's token when given. With `files` gRPC's FileWatcherCertificateProvider
// reads their copy every second (TlsFiles keeps it whole and current); else
// the files are read once here.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(
    const ServerOptions& options, std::shared_ptr<TokenAuthenticator> authenticator,
    const TlsFiles* files) {
  if (options.tls_cert_path.empty()) return grpc::InsecureServerCredentials();
  const bool mutual = !options.tls_client_ca_path.empty();
  const grpc_ssl_client_certificate_request_type request_type =
      mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (files != nullptr) {
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        files->key_path(), files->cert_path(), files->ca_path(), /*refresh_interval_sec=*/1);
    grpc::experimental::TlsServerCredentialsOptions tls(provider);
    tls.watch_identity_key_cert_pairs();
    if (mutual) tls.watch_root_certs();
    tls.set_cert_request_type(request_type);
    credentials = grpc::experimental::TlsServerCredentials(tls);
  } else {
    std::string cert_pem, key_pem, client_ca_pem;
    ASSIGN_OR_RETURN(cert_pem, ReadPem(options.tls_cert_path, "tls_cert"));
    ASSIGN_OR_RETURN(key_pem, ReadPem(options.tls_key_path, "tls_key"));
    RETURN_IF_ERROR(CheckKeyMatchesCertificate(cert_pem, key_pem));
    if (mutual) {
      ASSIGN_OR_RETURN(client_ca_pem, ReadPem(options.tls_client_ca_path, "tls_client_ca"));
    }
    grpc::SslServerCredentialsOptions ssl(request_type);
    ssl.pem_key_cert_pairs.push_back({std::move(key_pem), std::move(cert_pem)});
    ssl.pem_root_certs = std::move(client_ca_pem);
    credentials = grpc::SslServerCredentials(ssl);
  }
  if (authenticator != nullptr) credentials->SetAuthMetadataProcessor(std::move(authenticator));
  return credentials;
}

// What the per-device gauges show, read from the engine's devices.
std::vector<DeviceState> DeviceStates(const Engine& engine) {
  const std::vector<ResidentUsage> resident = engine.store().Usage();
  std::vector<DeviceState> states;
  states.reserve(engine.num_devices());
  for (int i = 0; i < engine.num_devices(); ++i) {
    const Device& device = engine.device(i);
    const DeviceMemory memory = device.MemoryUsage();
    DeviceState state;
    state.index = device.description().index;
    state.memory_used_bytes = memory.used_bytes;
    state.memory_total_bytes = memory.total_bytes;
    state.inflight_shards = engine.InflightShards(i);
    state.inflight_bytes = engine.InflightBytes(i);
    state.healthy = device.healthy();
    if (size_t(i) < resident.size()) {
      state.resident_bytes = resident[i].bytes;
      state.resident_tensors = resident[i].tensors;
      state.resident_cap_bytes = resident[i].cap_bytes;
    }
    states.push_back(state);
  }
  return states;
}

// A duration as gRPC's millisecond channel arguments take it; infinite (and
// anything longer) is INT_MAX, which gRPC reads as never.
int Milliseconds(absl::Duration d) {
  if (d >= absl::Milliseconds(INT_MAX)) return INT_MAX;
  return static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// "0.0.0.0:50051" -> "0.0.0.0"; "[::]:0" -> "[::]".
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options) {
  RETURN_IF_ERROR(CheckOptions(options));
  BackendOptions backend;
  backend.backend = options.backend;
  backend.devices = options.devices;
  backend.device_weights = options.device_weights;
  backend.cpu_devices = options.cpu_devices;
  backend.pinned_staging_bytes = options.pinned_staging_bytes;
  backend.gpu_lanes = options.gpu_lanes;
  backend.staging_copy_threads = options.staging_copy_threads;
  backend.request_staging_bytes = options.request_staging_bytes;
  ASSIGN_OR_RETURN(DeviceSet devices, CreateDevices(backend));
  return Create(std::move(options), std::move(devices));
}

absl::StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options, DeviceSet devices) {
  RETURN_IF_ERROR(CheckOptions(options));
  if (devices.devices.empty()) return absl::InvalidArgumentError("no devices to serve");
  // One index space: a device's index is its position, in the engine, the
  // timings and the metrics alike.
  for (size_t i = 0; i < devices.devices.size(); ++i) {
    if (devices.devices[i]->description().index != static_cast<int>(i)) {
      return absl::InvalidArgumentError(absl::StrCat("device ", i, " describes itself as device ",
                                                     devices.devices[i]->description().index,
                                                     "; expected its position"));
    }
  }
  std::unique_ptr<Server> server(new Server(std::move(options)));
  const ServerOptions& opts = server->options_;
  server->metrics_ = std::make_unique<Metrics>();
  if (!opts.token_file.empty()) {
    Metrics* metrics = server->metrics_.get();
    TokenAuthenticator::Events events;
    events.refused = [metrics](absl::string_view reason) { metrics->AuthRefused(reason); };
    events.reloaded = [metrics](bool ok, size_t tokens) { metrics->TokensReloaded(ok, tokens); };
    absl::StatusOr<std::shared_ptr<TokenAuthenticator>> authenticator =
        TokenAuthenticator::Create(opts.token_file, opts.auth_exempt_health, std::move(events));
    if (!authenticator.ok()) {
      return absl::Status(authenticator.status().code(),
                          absl::StrCat("--token_file: ", authenticator.status().message()));
    }
    server->authenticator_ = *std::move(authenticator);
    metrics->EnableTokenMetrics(server->authenticator_->size());
  }
  if (!opts.tls_cert_path.empty() && opts.tls_reload_interval > absl::ZeroDuration()) {
    ASSIGN_OR_RETURN(server->tls_files_,
                     TlsFiles::Create(opts.tls_cert_path, opts.tls_key_path,
                                      opts.tls_client_ca_path, opts.tls_reload_interval));
  }
  ASSIGN_OR_RETURN(server->credentials_,
                   Credentials(opts, server->authenticator_, server->tls_files_.get()));

  std::vector<DeviceDescription> descriptions;
  for (const auto& device : devices.devices) descriptions.push_back(device->description());
  server->metrics_->SetDevices(descriptions);
  // GPU memory: up to half for resident tensors, up to 3/8 for the shards in
  // flight, the rest for the pool's slack and the kernels' workspaces.
  std::vector<int64_t> device_limits;
  TensorStoreOptions resident;
  for (const DeviceDescription& d : descriptions) {
    device_limits.push_back(opts.device_max_inflight_bytes >= 0 ? opts.device_max_inflight_bytes
                            : d.kind == "cuda"                  ? d.memory_bytes / 8 * 3
                                                                : 0);
    resident.device_cap_bytes.push_back(opts.resident_max_bytes_per_device >= 0
                                            ? opts.resident_max_bytes_per_device
                                            : d.memory_bytes / 2);
  }
  resident.quota_bytes = opts.resident_quota_bytes;
  resident.max_tensors = opts.resident_max_tensors;
  resident.lease = opts.resident_lease;
  server->request_arena_ = std::move(devices.request_arena);
  server->engine_ =
      std::make_unique<Engine>(devices.backend, std::move(devices.devices), server->metrics_.get(),
                               std::move(device_limits), std::move(resident));
  server->metrics_->SetExpirationsSource(
      [engine = server->engine_.get()] { return engine->store().expirations(); });
  const Engine* engine = server->engine_.get();
  server->metrics_->SetDeviceRefresh([engine] { return DeviceStates(*engine); });
  server->admission_ = std::make_unique<Admission>(
      opts.max_inflight_bytes, "--max_inflight_bytes",
      [metrics = server->metrics_.get()](int64_t delta) { metrics->AddInflightBytes(delta); });
  int threads = opts.worker_threads;
  if (threads == 0) {
    threads = std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency()));
  }
  server->pool_ = std::make_unique<WorkerPool>(threads);

  ServiceOptions service;
  service.limits.max_output_bytes = opts.max_message_bytes - kResponseEnvelopeBytes;
  service.limits.head_dims = devices.head_dims;
  // A stream holds request bytes before admission sees them and answer
  // bytes after it has let them go: bound them by the admission limit too.
  if (opts.max_inflight_bytes > 0) service.batch_window_bytes = opts.max_inflight_bytes;
  service.stalled_stream_timeout = opts.stalled_stream_timeout;
  service.max_message_bytes = opts.max_message_bytes;
  service.request_arena = server->request_arena_.get();
  server->service_ =
      std::make_unique<ComputeService>(server->engine_.get(), server->admission_.get(),
                                       server->pool_.get(), server->metrics_.get(), service);
  return server;
}

Server::~Server() {
  Shutdown();
  // Scrapes go on until the metrics go, after the engine the refresh reads.
  if (metrics_ != nullptr) metrics_->SetDeviceRefresh(nullptr);
}

absl::Status Server::Start() {
  absl::Status status = StartServing();
  // A server that failed to start counts as stopped, so Wait() returns.
  if (!status.ok() && !stopped_.HasBeenNotified()) stopped_.Notify();
  return status;
}

absl::Status Server::StartServing() {
  {
    absl::MutexLock lock(&mu_);
    if (started_ || shutting_down_) {
      return absl::FailedPreconditionError("the server was already started");
    }
    started_ = true;
  }
  if (!options_.metrics_listen.empty()) {
    RETURN_IF_ERROR(metrics_->Serve(options_.metrics_listen));
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Without SO_REUSEPORT a second server on a port in use fails to start
  // instead of silently sharing it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options_.listen, credentials_, &port_);
  // Health turns NOT_SERVING once no device is left (GPUs that failed for good).
  service_->SetNoHealthyDeviceCallback(
      [this] { grpc_server_->GetHealthCheckService()->SetServingStatus(false); });
  builder.RegisterService(service_.get());
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(options_.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             Milliseconds(options_.keepalive_timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                             Milliseconds(options_.max_connection_age));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                             Milliseconds(options_.max_connection_age_grace));
  builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
  // What a client may send on a stream before the server reads from it:
  // HTTP/2's 64 KiB stream window, kept fixed. With gRPC's default probing
  // of the bandwidth-delay product the window grows with the traffic, up
  // to tens of MiB on loopback, which every call waiting for admission
  // would be sent ahead (1 GB for 36 waiting 32 MiB GEMMs). A stream being
  // read gets up to 1 MiB more at a time whatever this is.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || port_ == 0) {
    grpc_server_.reset();
    return absl::UnavailableError(
        options_.tls_cert_path.empty()
            ? absl::StrCat("cannot listen on ", options_.listen, " (--listen)")
            : absl::StrCat("cannot listen on ", options_.listen,
                           " with the certificate and key given (--listen, --tls_cert, --tls_key: "
                           "is the key the certificate's?)"));
  }
  grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus(kServiceName, true);

  if (!options_.ready_file.empty()) RETURN_IF_ERROR(WriteReadyFile());
  const std::string metrics =
      options_.metrics_listen.empty()
          ? std::string("metrics off")
          : absl::StrCat("metrics on ", HostOf(options_.metrics_listen), ":", metrics_->port());
  const std::string security = options_.tls_cert_path.empty()        ? std::string("plaintext")
                               : options_.tls_client_ca_path.empty() ? std::string("TLS")
                                                                     : std::string("mutual TLS");
  const std::string tokens = authenticator_ == nullptr
                                 ? std::string()
                                 : absl::StrCat(", ", authenticator_->size(), " bearer tokens");
  std::fprintf(
      stderr, "gpucompute-server listening on %s:%d (%s%s), %s (backend %s, %d device%s)\n",
      HostOf(options_.listen).c_str(), port_, security.c_str(), tokens.c_str(), metrics.c_str(),
      engine_->backend().c_str(), engine_->num_devices(), engine_->num_devices() == 1 ? "" : "s");
  return absl::OkStatus();
}

absl::Status Server::WriteReadyFile() const {
  const std::string tmp = absl::StrCat(options_.ready_file, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "{\"grpc_port\": " << port_ << ", \"metrics_port\": " << metrics_->port() << "}\n";
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::InternalError(absl::StrCat("--ready_file: cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), options_.ready_file.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("--ready_file: cannot rename ", tmp, " to ", options_.ready_file));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Server::ReloadTls() {
  if (tls_files_ == nullptr) {
    return absl::FailedPreconditionError("no TLS files to read again (--tls_reload_interval=0)");
  }
  bool replaced = false;
  RETURN_IF_ERROR(tls_files_->Reload(&replaced));
  return replaced;
}

absl::StatusOr<size_t> Server::ReloadTokens() {
  if (authenticator_ == nullptr) {
    return absl::FailedPreconditionError("no --token_file to reload");
  }
  return authenticator_->Reload();
}

void Server::Wait() {
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return;
  }
  stopped_.WaitForNotification();
}

void Server::Shutdown() {
  bool first;
  {
    absl::MutexLock lock(&mu_);
    first = !shutting_down_;
    shutting_down_ = true;
  }
  if (!first) {
    stopped_.WaitForNotification();
    return;
  }
  const absl::Time deadline = absl::Now() + options_.shutdown_timeout;
  if (grpc_server_ != nullptr) {
    // Health turns NOT_SERVING for good, which every Watch is sent. While
    // the Compute calls accepted finish (operations in flight, open
    // streams, answers being sent; until the deadline), new calls are still
    // taken in and answered UNAVAILABLE (retryable): gRPC's own shutdown
    // would drop them as CANCELLED.
    service_->StartDraining();
    grpc_server_->GetHealthCheckService()->Shutdown();
    if (!service_->WaitIdle(deadline)) {
      // Past the timeout, operations still queued or computing are stopped
      // and answered UNAVAILABLE: without it the workers below would wait
      // for them to finish, however long they take.
      service_->CancelOperations();
      service_->WaitIdle(absl::Now() + kStopGrace);
    }
    // Only calls of other services are left, health Watches above all,
    // which end only when cancelled: they get a moment, not the deadline.
    grpc_server_->Shutdown(absl::ToChronoTime(std::min(deadline, absl::Now() + kCloseGrace)));
  }
  // Calls still running on the workers finish (their reactors complete).
  if (pool_ != nullptr) pool_->Stop();
  if (grpc_server_ != nullptr) grpc_server_->Wait();
  if (!stopped_.HasBeenNotified()) stopped_.Notify();
}

}  // namespace gpucompute
