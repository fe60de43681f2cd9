// The Compute service: thin gRPC callback-API handlers. Each waits for
// admission (server/engine/admission.h) before it receives its request's
// bytes, decodes and validates the request (validate.h), calls the engine on
// a worker of ours (never on gRPC's threads), encodes the result
// (convert.h) and finishes the call. The Batch stream's reactor is in
// batch_reactor.cc, the transfer streams' in transfer.cc.
//
// Host memory: everything a call holds (its request, received and decoded,
// its result, its answer until sent) counts against --max_inflight_bytes,
// from before the request is received to after the answer is sent. The
// operations and Echo are served as streams on the server's side (the wire
// format is unary), so that gRPC reads nothing of a request until the
// handler asks for it: a request that declares its size
// (kRequestBytesMetadataKey, as our clients do) is admitted before its
// bytes are read, or refused before they are if it can never fit; one that
// does not is received one at a time with a small reservation and admitted
// once its size is known.
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
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpucompute/v1/compute.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/device/host_arena.h"
#include "server/engine/admission.h"
#include "server/engine/engine.h"
#include "server/metrics/metrics.h"
#include "server/service/validate.h"
#include "server/service/worker_pool.h"

namespace gpucompute {

// Tensors of a request whose bytes were decoded into the request arena:
// each tensor message (its data field left empty) with the block that holds
// its bytes, given back when this goes.
struct StagedTensors {
  std::vector<std::pair<const google::protobuf::Message*, HostArena::Block>> blocks;
  // Bytes of tensors large enough for the arena that went there, and that
  // found no room there (decoded into ordinary memory).
  int64_t arena_bytes = 0;
  int64_t missed_bytes = 0;
};

struct ServiceOptions {
  // Checks beyond the wire format (result size, head dims).
  Limits limits;
  // Largest request or response message (--max_message_bytes); reported by
  // GetServerInfo; 0: not checked before a request is received.
  int64_t max_message_bytes = 0;
  // Items of one Batch stream read ahead of their answers being written;
  // beyond this the stream stops reading (flow control pushes back on the
  // client).
  int batch_window = 64;
  // Bytes one Batch stream holds between reading an item and writing its
  // answer: the request's until it is answered, then the answer's (which
  // holds admission for its encoded bytes until written). Beyond this the
  // stream stops reading too; at least one item is always read.
  int64_t batch_window_bytes = int64_t{1} << 30;
  // A Batch stream whose answer has waited this long to be written (its
  // client does not read) is ended RESOURCE_EXHAUSTED and its answers
  // dropped; infinite: never.
  absl::Duration stalled_stream_timeout = absl::Seconds(30);
  // Where the large tensors (kMinStagedBytes and more each) of operation
  // requests, unary calls and Batch items, are decoded when it has room
  // (else into strings as usual); null: nowhere. REQUIRES: outlives the
  // service.
  HostArena* request_arena = nullptr;
};

// Upload and Download are served raw: their chunks' bytes go between gRPC's
// slices and the tensor without protobuf copying them (proto/wire.h). The
// constructor makes Batch raw too (an item stays in gRPC's slices until
// admitted), replaces the unary operations and Echo by raw streams, and
// serves GetServerInfo, Free and ListTensors raw (ServeUnary). So every
// request is decoded here: one that is not a valid message is answered
// INVALID_ARGUMENT naming it, and counted under its method, where gRPC's
// own decoding would answer UNIMPLEMENTED with no message before any
// handler ran.
using ComputeServiceBase = v1::Compute::WithRawCallbackMethod_Upload<
    v1::Compute::WithRawCallbackMethod_Download<v1::Compute::CallbackService>>;

class ComputeService final : public ComputeServiceBase {
 public:
  // Request metadata with the byte size of the (encoded) request message of
  // a unary operation or Echo; optional. With it the server admits the call
  // before receiving the request, and refuses one that can never fit
  // (RESOURCE_EXHAUSTED naming --max_message_bytes or --max_inflight_bytes)
  // before its bytes are read. A request larger than it declared is refused
  // (INVALID_ARGUMENT).
  static constexpr char kRequestBytesMetadataKey[] = "gpucompute-request-bytes";

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

  // Resident tensors (transfer.cc holds the streams).
  // Upload: UploadRequest messages in, an UploadResponse out.
  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(grpc::CallbackServerContext* context,
                                                    grpc::ByteBuffer* response) override;
  // Download: a DownloadRequest in, DownloadResponse messages out.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Download(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;

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
  template <typename Request, typename Response>
  class OpCall;
  class UploadReactor;
  class DownloadReactor;
  class UploadAssembly;

  // Tensors this large and larger go to the request arena when it has room.
  static constexpr int64_t kMinStagedBytes = int64_t{1} << 20;

  // Decodes a request received raw, each large bytes field copied once: the
  // data of a tensor of kMinStagedBytes or more into a block of `arena`
  // (recorded in `*staged`) when it has room, every other one into a string
  // of its size. `arena` may be null (then `staged` is unused).
  static absl::Status Decode(const grpc::ByteBuffer& raw, google::protobuf::Message* message,
                             HostArena* arena = nullptr, StagedTensors* staged = nullptr);

  // Longest BatchRequest.id accepted (it is echoed in the answer).
  static constexpr size_t kMaxBatchIdBytes = 1024;

  // Host memory a request of `request_bytes` needs to be received and
  // decoded: its bytes as they came and their decoded copy.
  static int64_t ReceiveBytes(int64_t request_bytes);

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

  // Waits (without blocking) for `bytes` of `admission` for `call`, then
  // calls `then` with the ticket or the refusal: on this thread when that is
  // decided at once, a later ticket on a worker thread, a later refusal on
  // the thread that decides it (the watch's). `then` must not block. The
  // wait ends once `call` is abandoned (Abandoned), refused as
  // AbandonedStatus says (UNAVAILABLE after CancelOperations()).
  void WhenAdmitted(Admission& admission, int64_t bytes, const Call& call,
                    absl::AnyInvocable<void(absl::StatusOr<Admission::Ticket>)> then);

  // A Batch stream (raw: BatchRequest messages in, BatchResponse messages
  // out).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* OpenBatch(
      grpc::CallbackServerContext* context);

  // Serves `method` of the Compute service (a unary operation or Echo) as a
  // raw stream, each call an OpCall<Request, Response>.
  template <typename Request, typename Response>
  void ServeAsStream(absl::string_view method);

  // The body of a small unary method: fills `response` from `request`, or
  // returns the error the call ends with.
  template <typename Request, typename Response>
  using UnaryBody = absl::Status (ComputeService::*)(grpc::CallbackServerContext& context,
                                                     const Request& request, Response* response);
  // Serves `method` of the Compute service raw, on gRPC's thread: decodes
  // the request (INVALID_ARGUMENT naming it when it is not a valid
  // `Request`, or when the call carried none), runs `body`, encodes its
  // response and counts the call under `method`.
  template <typename Request, typename Response>
  void ServeUnary(absl::string_view method, UnaryBody<Request, Response> body);

  // GetServerInfo, Free and ListTensors (ServeUnary's bodies).
  absl::Status GetServerInfoBody(grpc::CallbackServerContext& context,
                                 const v1::ServerInfoRequest& request,
                                 v1::ServerInfoResponse* response);
  absl::Status FreeBody(grpc::CallbackServerContext& context, const v1::FreeRequest& request,
                        v1::FreeResponse* response);
  absl::Status ListTensorsBody(grpc::CallbackServerContext& context,
                               const v1::ListTensorsRequest& request,
                               v1::ListTensorsResponse* response);

  // What an operation holds while it is served: its admission and the
  // request as it was received.
  struct Holding {
    // The server's admission (--max_inflight_bytes) for the call's host
    // memory: first what receiving the request needs, then what running it
    // does (HostBytes), then its encoded answer until that is sent.
    Admission::Ticket ticket;
    // receive_slot_, held while the request's bytes are not all admitted.
    Admission::Ticket slot;
    // The request's bytes as received; cleared once they are decoded and
    // the operation admitted.
    grpc::ByteBuffer raw;
    int64_t request_bytes = 0;
    // Seconds from starting to read the request to its last byte (0 where
    // the call's time starts once its request is in: Batch items).
    double receive_seconds = 0;
    // Seconds decoding its bytes into the request message before Execute
    // (part of the decode stage).
    double decode_seconds = 0;
    // Counted in the queue depth (EnterQueue) and not yet left.
    bool queued = false;
    // Set by Execute when `ticket` is not enough: the bytes to wait for.
    int64_t more_bytes = 0;
    // The request's tensors decoded into the request arena, while it runs
    // (null: none).
    const StagedTensors* staged = nullptr;
  };

  // One item of a Batch stream, on the calling (worker) thread: checks its id
  // and op and runs it (Execute), filling response's id and result and
  // `*method` (the metrics' name, "Batch/<Op>"); returns the item's status.
  // As Execute, it may instead ask for more admission.
  absl::Status ExecuteBatchItem(const v1::BatchRequest& item, const Call& call,
                                v1::BatchResponse* response, Holding* holding,
                                absl::string_view* method);

  // Validate, compute, encode: the whole of one operation, on the calling
  // (worker) thread, under `holding` (the admission taken before the request
  // was received). When the operation needs more than holding->ticket
  // (HostBytes), sets holding->more_bytes to what it needs and returns OK
  // without running: the caller gives the ticket back, waits for that much
  // and calls again. Otherwise the ticket shrinks to what the operation
  // needs, the raw request and the receive slot are let go, the operation
  // leaves the queue, and `response` is filled on success. The caller holds
  // the ticket until the answer is sent. An operation whose call is
  // abandoned (Abandoned) before it starts or while it runs stops, with
  // AbandonedStatus's code (UNAVAILABLE after CancelOperations()).
  template <typename Request, typename Response>
  absl::Status Execute(const Request& request, Response* response, const Call& call,
                       Holding* holding);
  // Echo: the tensor checked and moved (not copied) into the response.
  absl::Status Execute(v1::EchoRequest& request, v1::EchoResponse* response, const Call& call,
                       Holding* holding);
  // The part of Execute after validation, once the request is admitted in
  // full: lets go of what was only needed to receive it.
  void Admitted(int64_t host_bytes, Holding* holding);

  // Operations run on the gRPC thread that received them (small requests):
  // true when one more may.
  bool TryRunInline();
  void DoneInline() { inline_ops_.fetch_sub(1); }

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
  // The watch's thread: ends the admission waits whose deadline passed or
  // whose call was cancelled (every few milliseconds) and, every fraction of
  // stalled_stream_timeout, the streams whose answer has waited longer than
  // that to be written.
  void Watch();

  Engine* const engine_;
  std::function<void()> on_no_healthy_device_;
  Admission* const admission_;
  // Requests that did not declare their size are received one at a time,
  // and so are requests that outgrew what was reserved for them while they
  // wait for more: at most one is held outside admission.
  Admission receive_slot_{1, "one request received ahead of its admission at a time"};
  WorkerPool* const pool_;
  Metrics* const metrics_;
  const ServiceOptions options_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> cancel_operations_{false};
  // Operations running on gRPC's threads now (OpCall: small requests).
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
  std::thread watch_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_COMPUTE_SERVICE_H_
