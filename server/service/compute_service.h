// The Compute service: thin gRPC callback-API handlers. Each decodes and
// validates its request (validate.h), waits for admission
// (server/engine/admission.h), calls the engine on a worker of ours (never
// on gRPC's threads), encodes the result (convert.h) and finishes the call
// from the worker. The Batch stream's reactor is in batch_reactor.cc.
#ifndef GPUCOMPUTE_SERVER_SERVICE_COMPUTE_SERVICE_H_
#define GPUCOMPUTE_SERVER_SERVICE_COMPUTE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpucompute/v1/compute.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/engine/admission.h"
#include "server/engine/engine.h"
#include "server/metrics/metrics.h"
#include "server/service/validate.h"
#include "server/service/worker_pool.h"

namespace gpucompute {

struct ServiceOptions {
  // Checks beyond the wire format (result size, head dims).
  Limits limits;
  // Reported by GetServerInfo.
  int64_t max_message_bytes = 0;
  // Items of one Batch stream read ahead of their answers being written;
  // beyond this the stream stops reading (flow control pushes back on the
  // client).
  int batch_window = 64;
  // Bytes one Batch stream holds between reading an item and writing its
  // answer: the request's until it is answered, then the answer's (which
  // holds no admission once computed). Beyond this the stream stops reading
  // too; at least one item is always read.
  int64_t batch_window_bytes = int64_t{1} << 30;
  // A Batch stream whose answer has waited this long to be written (its
  // client does not read) is ended RESOURCE_EXHAUSTED and its answers
  // dropped; infinite: never.
  absl::Duration stalled_stream_timeout = absl::Seconds(30);
};

// Upload and Download are served raw: their chunks' bytes go between gRPC's
// slices and the tensor without protobuf copying them (proto/wire.h).
using ComputeServiceBase = v1::Compute::WithRawCallbackMethod_Upload<
    v1::Compute::WithRawCallbackMethod_Download<v1::Compute::CallbackService>>;

class ComputeService final : public ComputeServiceBase {
 public:
  // Borrows everything; all of it must outlive the service and every call
  // it has started (the server drains calls and the pool first).
  ComputeService(Engine* engine, Admission* admission, WorkerPool* pool, Metrics* metrics,
                 ServiceOptions options);
  // Stops the watch on stalled Batch streams. REQUIRES: every call is done
  // with (gRPC's server shut down).
  ~ComputeService();
  ComputeService(const ComputeService&) = delete;
  ComputeService& operator=(const ComputeService&) = delete;

  // Called (from a worker thread) when an operation fails and no healthy
  // device is left, so that health can turn NOT_SERVING. REQUIRES: set
  // before the server starts.
  void SetNoHealthyDeviceCallback(std::function<void()> callback) {
    on_no_healthy_device_ = std::move(callback);
  }

  grpc::ServerUnaryReactor* Gemm(grpc::CallbackServerContext* context,
                                 const v1::GemmRequest* request,
                                 v1::GemmResponse* response) override;
  grpc::ServerUnaryReactor* Gemv(grpc::CallbackServerContext* context,
                                 const v1::GemvRequest* request,
                                 v1::GemvResponse* response) override;
  grpc::ServerUnaryReactor* Reduce(grpc::CallbackServerContext* context,
                                   const v1::ReduceRequest* request,
                                   v1::ReduceResponse* response) override;
  grpc::ServerUnaryReactor* Transpose(grpc::CallbackServerContext* context,
                                      const v1::TransposeRequest* request,
                                      v1::TransposeResponse* response) override;
  grpc::ServerUnaryReactor* Attention(grpc::CallbackServerContext* context,
                                      const v1::AttentionRequest* request,
                                      v1::AttentionResponse* response) override;
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context,
                                 const v1::EchoRequest* request,
                                 v1::EchoResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::ServerInfoRequest* request,
                                          v1::ServerInfoResponse* response) override;
  grpc::ServerBidiReactor<v1::BatchRequest, v1::BatchResponse>* Batch(
      grpc::CallbackServerContext* context) override;
  // Resident tensors (transfer.cc holds the streams).
  // Upload: UploadRequest messages in, an UploadResponse out.
  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(grpc::CallbackServerContext* context,
                                                    grpc::ByteBuffer* response) override;
  // Download: a DownloadRequest in, DownloadResponse messages out.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Download(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Free(grpc::CallbackServerContext* context,
                                 const v1::FreeRequest* request,
                                 v1::FreeResponse* response) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* context,
                                        const v1::ListTensorsRequest* request,
                                        v1::ListTensorsResponse* response) override;

  // The owner of a call's resident tensors: the client's identity (its
  // bearer token's, else its TLS client certificate's: CallIdentity in
  // auth.h) when it has one, whatever session it names; else its
  // "gpucompute-session" metadata ("" without one).
  static std::string OwnerOf(const grpc::CallbackServerContext& context);

  // From now on new calls (but GetServerInfo) are answered UNAVAILABLE at
  // once; calls already accepted, and items of open Batch streams, go on.
  void StartDraining() { draining_ = true; }

  // Stops every operation accepted and not yet answered (unary calls and
  // Batch items): those waiting for admission or a worker give up, those
  // computing stop (CPU kernels between blocks; shards not started are
  // dropped), and each is answered UNAVAILABLE (retryable elsewhere). For
  // shutdown once its timeout has passed; for good.
  void CancelOperations() { cancel_operations_ = true; }

  // Blocks until no operation is running or queued (unary calls and Batch
  // items) and every call of this service that was accepted is done with
  // (its answer sent, its stream closed), or until `deadline`. True when
  // idle. Calls refused while draining are not waited for.
  bool WaitIdle(absl::Time deadline);

 private:
  class BatchReactor;
  class RejectedStream;
  class UnaryReactor;
  class UploadReactor;
  class DownloadReactor;
  class UploadAssembly;

  // UNAVAILABLE while draining, counted under `method`.
  absl::Status CheckAccepting(absl::string_view method);

  // What an operation needs to know about the call it belongs to.
  struct Call {
    grpc::CallbackServerContext* context;
    absl::Time accepted;
    absl::Time deadline;
    std::string owner;  // OwnerOf(context)
  };

  Call StartCall(grpc::CallbackServerContext* context) const;
  // True once nobody waits for `call`'s result: the client cancelled or
  // passed its deadline, or CancelOperations() was called. Cheap; may be
  // asked from any thread while the call is open.
  bool Abandoned(const Call& call) const;
  // Why `call`'s operation stops, `when` ("before the operation started",
  // "while the operation ran") said in the message: UNAVAILABLE after
  // CancelOperations(), CANCELLED when the client cancelled,
  // DEADLINE_EXCEEDED past the deadline; OK while the result is wanted.
  absl::Status AbandonedStatus(const Call& call, absl::string_view when) const;
  // When waiting for admission (the server's and the devices') ends for
  // `call`: a tenth of the call's time (20 ms to 1 s) before its deadline, so
  // that the refusal (RESOURCE_EXHAUSTED) reaches the client before the
  // client's own deadline, which runs a little ahead of the server's (the
  // server's starts when the call's headers arrive).
  static absl::Time AdmissionDeadline(const Call& call);

  // Schedules `request` on the pool and finishes the call from there.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* RunUnary(absl::string_view method, grpc::CallbackServerContext* context,
                                     const Request* request, Response* response);

  // One item of a Batch stream, on the calling (worker) thread: checks its id
  // and op and runs it (Execute), filling response's id and result and
  // `*method` (the metrics' name, "Batch/<Op>"). The item has been entered
  // in the queue (EnterQueue); returns the item's status.
  absl::Status ExecuteBatchItem(const v1::BatchRequest& item, const Call& call,
                                v1::BatchResponse* response, Admission::Ticket* ticket,
                                absl::string_view* method);

  // Validate, admit, compute, encode: the whole of one operation, on the
  // calling (worker) thread. `response` is filled only on success.
  // `ticket` receives the admission, which the caller holds until the
  // response is sent.
  template <typename Request, typename Response>
  absl::Status Execute(const Request& request, Response* response, const Call& call,
                       Admission::Ticket* ticket);

  // The upload a stream's header starts or joins: a new pending tensor, or
  // the upload in progress with the same owner and upload_id (parts > 1).
  // Errors: the store's (caps, quota, device), INVALID_ARGUMENT for a header
  // that differs from the upload's.
  absl::StatusOr<std::shared_ptr<UploadAssembly>> JoinUpload(const std::string& owner,
                                                             const v1::UploadHeader& header);
  // Forgets an upload that completed or failed; returns its tensor (null
  // once dropped).
  std::shared_ptr<ResidentTensor> FinishUpload(const std::string& owner,
                                               const std::shared_ptr<UploadAssembly>& assembly);

  // Returns an admission ticket's bytes (if any) and updates the gauge.
  void ReleaseTicket(Admission::Ticket& ticket);

  // Accepted operations that have not started computing.
  void EnterQueue();
  void LeaveQueue();

  // Operations accepted and not yet answered (for WaitIdle).
  void BeginOp();
  void EndOp();
  // Calls accepted that gRPC is not done with yet (for WaitIdle): from the
  // reactor's creation to its OnDone.
  void BeginCall();
  void EndCall();

  // Open Batch streams, for the watch on stalled ones: a stream is watched
  // from its reactor's creation to its OnDone.
  void WatchStream(BatchReactor* stream);
  void UnwatchStream(BatchReactor* stream);
  // The watch's thread: every fraction of stalled_stream_timeout, ends the
  // streams whose answer has waited longer than that to be written.
  void WatchStalledStreams();

  Engine* const engine_;
  std::function<void()> on_no_healthy_device_;
  Admission* const admission_;
  WorkerPool* const pool_;
  Metrics* const metrics_;
  const ServiceOptions options_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> cancel_operations_{false};
  // Operations running on gRPC's threads now (RunUnary: small requests).
  std::atomic<int> inline_ops_{0};
  // Multi-part uploads in progress, by owner and upload_id.
  absl::Mutex uploads_mu_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<UploadAssembly>> uploads_
      ABSL_GUARDED_BY(uploads_mu_);
  absl::Mutex ops_mu_;
  int64_t active_ops_ ABSL_GUARDED_BY(ops_mu_) = 0;
  int64_t open_calls_ ABSL_GUARDED_BY(ops_mu_) = 0;
  // Locked before any stream's own mutex.
  absl::Mutex streams_mu_;
  std::set<BatchReactor*> streams_ ABSL_GUARDED_BY(streams_mu_);
  bool stop_watch_ ABSL_GUARDED_BY(streams_mu_) = false;
  std::thread watch_;  // not started when the timeout is infinite
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_COMPUTE_SERVICE_H_
