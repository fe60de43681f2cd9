#include "server/service/compute_service.h"

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/common/status_macros.h"
#include "server/service/convert.h"

#ifndef GPUCOMPUTE_VERSION
#define GPUCOMPUTE_VERSION "0.0.0-dev"
#endif

namespace gpucompute {
namespace {

// Longest BatchRequest.id accepted (it is echoed in the answer).
constexpr size_t kMaxBatchIdBytes = 1024;

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// A call the client cancelled, or whose deadline passed, ends for the client
// with that code whatever the server computed.
absl::StatusCode CodeSeenByClient(const absl::Status& status, grpc::CallbackServerContext* context,
                                  absl::Time deadline) {
  if (!context->IsCancelled()) return status.code();
  return absl::Now() >= deadline ? absl::StatusCode::kDeadlineExceeded
                                 : absl::StatusCode::kCancelled;
}

// Request type -> validated spec, and spec -> engine call.
absl::StatusOr<GemmSpec> Parse(const v1::GemmRequest& r, const Limits& l) {
  return ParseGemm(r, l);
}
absl::StatusOr<GemvSpec> Parse(const v1::GemvRequest& r, const Limits& l) {
  return ParseGemv(r, l);
}
absl::StatusOr<ReduceSpec> Parse(const v1::ReduceRequest& r, const Limits& l) {
  return ParseReduce(r, l);
}
absl::StatusOr<TransposeSpec> Parse(const v1::TransposeRequest& r, const Limits& l) {
  return ParseTranspose(r, l);
}
absl::StatusOr<AttentionSpec> Parse(const v1::AttentionRequest& r, const Limits& l) {
  return ParseAttention(r, l);
}

absl::StatusOr<OpResult> Run(Engine& engine, const GemmSpec& spec) { return engine.Gemm(spec); }
absl::StatusOr<OpResult> Run(Engine& engine, const GemvSpec& spec) { return engine.Gemv(spec); }
absl::StatusOr<OpResult> Run(Engine& engine, const ReduceSpec& spec) { return engine.Reduce(spec); }
absl::StatusOr<OpResult> Run(Engine& engine, const TransposeSpec& spec) {
  return engine.Transpose(spec);
}
absl::StatusOr<OpResult> Run(Engine& engine, const AttentionSpec& spec) {
  return engine.Attention(spec);
}

}  // namespace

ComputeService::ComputeService(Engine* engine, Admission* admission, WorkerPool* pool,
                               Metrics* metrics, ServiceOptions options)
    : engine_(engine),
      admission_(admission),
      pool_(pool),
      metrics_(metrics),
      options_(std::move(options)) {
  for (absl::string_view method :
       {"Gemm", "Gemv", "Reduce", "Transpose", "Attention", "Echo", "GetServerInfo", "Batch"}) {
    metrics_->AddMethod(method);
  }
}

ComputeService::Call ComputeService::StartCall(grpc::CallbackServerContext* context) const {
  return Call{context, absl::Now(), absl::FromChrono(context->deadline())};
}

void ComputeService::ReleaseTicket(Admission::Ticket& ticket) {
  if (ticket.bytes() == 0) return;
  metrics_->AddInflightBytes(-ticket.bytes());
  ticket = Admission::Ticket();
}

void ComputeService::BeginOp() {
  absl::MutexLock lock(&ops_mu_);
  ++active_ops_;
}

void ComputeService::EndOp() {
  absl::MutexLock lock(&ops_mu_);
  --active_ops_;
}

bool ComputeService::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&ops_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_) { return active_ops_ == 0; };
  return ops_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void ComputeService::EnterQueue() { metrics_->AddQueueDepth(1); }
void ComputeService::LeaveQueue() { metrics_->AddQueueDepth(-1); }

template <typename Request, typename Response>
absl::Status ComputeService::Execute(const Request& request, Response* response, const Call& call,
                                     Admission::Ticket* ticket) {
  // The operation counts as queued until it starts computing.
  struct QueueSlot {
    ComputeService* service;
    bool queued = true;
    void Leave() {
      if (queued) service->LeaveQueue();
      queued = false;
    }
    ~QueueSlot() { Leave(); }
  } slot{this};
  ASSIGN_OR_RETURN(auto spec, Parse(request, options_.limits));
  grpc::CallbackServerContext* context = call.context;
  ASSIGN_OR_RETURN(*ticket, admission_->Admit(FootprintBytes(spec), call.deadline,
                                              [context] { return context->IsCancelled(); }));
  metrics_->AddInflightBytes(ticket->bytes());
  slot.Leave();
  if (context->IsCancelled()) return absl::CancelledError("the call was cancelled");
  if (absl::Now() >= call.deadline) {
    return absl::DeadlineExceededError("the deadline passed before the operation started");
  }
  const double queue_seconds = SecondsSince(call.accepted);
  // The devices' own admission waits no longer than the call.
  spec.options.deadline = call.deadline;
  spec.options.cancelled = [context] { return context->IsCancelled(); };
  absl::StatusOr<OpResult> result = Run(*engine_, spec);
  if (!result.ok()) {
    if (on_no_healthy_device_ && !engine_->AnyHealthy()) on_no_healthy_device_();
    return result.status();
  }
  FillResponse(*result, SecondsSince(call.accepted), queue_seconds + result->device_wait_seconds,
               response);
  return absl::OkStatus();
}

absl::Status ComputeService::CheckAccepting(absl::string_view method) {
  if (!draining_) return absl::OkStatus();
  absl::Status status =
      absl::UnavailableError("the server is shutting down; retry on another replica");
  metrics_->RequestStarted();
  metrics_->RequestFinished(method, status.code(), 0);
  return status;
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* ComputeService::RunUnary(absl::string_view method,
                                                   grpc::CallbackServerContext* context,
                                                   const Request* request, Response* response) {
  if (absl::Status status = CheckAccepting(method); !status.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  const Call call = StartCall(context);
  metrics_->RequestStarted();
  metrics_->AddReceivedBytes(static_cast<int64_t>(request->ByteSizeLong()));
  BeginOp();
  EnterQueue();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  pool_->Schedule([this, method, call, request, response, reactor] {
    Admission::Ticket ticket;
    const absl::Status status = Execute(*request, response, call, &ticket);
    if (status.ok()) metrics_->AddSentBytes(static_cast<int64_t>(response->ByteSizeLong()));
    metrics_->RequestFinished(method, CodeSeenByClient(status, call.context, call.deadline),
                              SecondsSince(call.accepted));
    // The call's messages and context may be gone once Finish returns. The
    // ticket is held until then: the response's bytes are in flight too.
    reactor->Finish(ToGrpcStatus(status));
    ReleaseTicket(ticket);
    EndOp();
  });
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::Gemm(grpc::CallbackServerContext* context,
                                               const v1::GemmRequest* request,
                                               v1::GemmResponse* response) {
  return RunUnary("Gemm", context, request, response);
}

grpc::ServerUnaryReactor* ComputeService::Gemv(grpc::CallbackServerContext* context,
                                               const v1::GemvRequest* request,
                                               v1::GemvResponse* response) {
  return RunUnary("Gemv", context, request, response);
}

grpc::ServerUnaryReactor* ComputeService::Reduce(grpc::CallbackServerContext* context,
                                                 const v1::ReduceRequest* request,
                                                 v1::ReduceResponse* response) {
  return RunUnary("Reduce", context, request, response);
}

grpc::ServerUnaryReactor* ComputeService::Transpose(grpc::CallbackServerContext* context,
                                                    const v1::TransposeRequest* request,
                                                    v1::TransposeResponse* response) {
  return RunUnary("Transpose", context, request, response);
}

grpc::ServerUnaryReactor* ComputeService::Attention(grpc::CallbackServerContext* context,
                                                    const v1::AttentionRequest* request,
                                                    v1::AttentionResponse* response) {
  return RunUnary("Attention", context, request, response);
}

grpc::ServerUnaryReactor* ComputeService::Echo(grpc::CallbackServerContext* context,
                                               const v1::EchoRequest* request,
                                               v1::EchoResponse* response) {
  // The transport baseline: answered on the gRPC thread, the payload moved
  // (not copied) from request to response.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status status = CheckAccepting("Echo"); !status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  const absl::Time accepted = absl::Now();
  metrics_->RequestStarted();
  const int64_t size = static_cast<int64_t>(request->ByteSizeLong());
  metrics_->AddReceivedBytes(size);
  absl::Status status;
  if (!request->has_input()) {
    status = absl::InvalidArgumentError("input: missing tensor; expected any valid tensor");
  } else {
    status = ParseTensor(request->input(), "input").status();
  }
  if (status.ok()) {
    // The request message belongs to this call and is not read again.
    response->mutable_output()->Swap(const_cast<v1::EchoRequest*>(request)->mutable_input());
    response->mutable_timings()->set_server_seconds(SecondsSince(accepted));
    metrics_->AddSentBytes(static_cast<int64_t>(response->ByteSizeLong()));
  }
  metrics_->RequestFinished("Echo", status.code(), SecondsSince(accepted));
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::GetServerInfo(grpc::CallbackServerContext* context,
                                                        const v1::ServerInfoRequest* request,
                                                        v1::ServerInfoResponse* response) {
  const absl::Time accepted = absl::Now();
  metrics_->RequestStarted();
  response->set_version(GPUCOMPUTE_VERSION);
  response->set_backend(engine_->backend());
  for (int i = 0; i < engine_->num_devices(); ++i) {
    const Device& device = engine_->device(i);
    v1::DeviceInfo* info = response->add_devices();
    FillDeviceInfo(device.description(), device.healthy(), info);
    info->set_max_inflight_bytes(engine_->MaxInflightBytes(i));
  }
  for (OpKind op : kAllOps) {
    v1::OperationVariants* variants = response->add_operations();
    variants->set_operation(std::string(OpName(op)));
    for (std::string& name : engine_->Variants(op)) variants->add_variants(std::move(name));
  }
  response->set_max_message_bytes(options_.max_message_bytes);
  response->set_max_inflight_bytes(admission_->limit());
  metrics_->AddSentBytes(static_cast<int64_t>(response->ByteSizeLong()));
  metrics_->RequestFinished("GetServerInfo", absl::StatusCode::kOk, SecondsSince(accepted));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

// One Batch stream. Items are read (at most batch_window ahead of their
// answers), run concurrently on the pool, and answered as they finish, one
// write in flight at a time with a queue behind it. A failed item is answered
// with its own code; the stream finishes OK after the client's half-close
// once every item is answered.
//
// gRPC may run reactions concurrently, so the state is under mu_; gRPC
// operations (StartRead, StartWrite, Finish) are started after mu_ is
// released, each decided under it by exactly one party.
class ComputeService::BatchReactor final
    : public grpc::ServerBidiReactor<v1::BatchRequest, v1::BatchResponse> {
 public:
  BatchReactor(ComputeService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), accepted_(absl::Now()) {
    service_->metrics_->RequestStarted();
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-close, cancellation or a broken stream
      Act(Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        reads_done_ = true;
        return Actions{};
      }));
      return;
    }
    auto item = std::make_shared<v1::BatchRequest>();
    item->Swap(&request_);
    const Call call{context_, absl::Now(), absl::FromChrono(context_->deadline())};
    const int64_t item_bytes = static_cast<int64_t>(item->ByteSizeLong());
    service_->metrics_->AddReceivedBytes(item_bytes);
    bool run = false;
    Actions actions = Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      Actions a;
      if (broken_) return a;  // nobody is listening; stop reading
      run = true;
      ++outstanding_;
      outstanding_bytes_ += item_bytes;
      if (WindowOpen()) {
        a.read = true;
      } else {
        read_paused_ = true;
      }
      return a;
    });
    if (run) {
      service_->BeginOp();
      service_->EnterQueue();
      service_->pool_->Schedule(
          [this, item, call, item_bytes] { RunItem(*item, call, item_bytes); });
    }
    Act(actions);
  }

  void OnWriteDone(bool ok) override {
    std::vector<Admission::Ticket> done;  // released after mu_
    const Actions actions = Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      Actions a;
      done.push_back(std::move(writes_.front().ticket));
      outstanding_bytes_ -= writes_.front().request_bytes;
      writes_.pop_front();
      --outstanding_;
      if (!ok) {
        broken_ = true;
        outstanding_ -= static_cast<int>(writes_.size());
        for (Pending& pending : writes_) {
          done.push_back(std::move(pending.ticket));
          outstanding_bytes_ -= pending.request_bytes;
        }
        writes_.clear();
      }
      if (!writes_.empty()) {
        a.write = writes_.front().response.get();
      } else {
        writing_ = false;
      }
      if (read_paused_ && !broken_ && WindowOpen()) {
        read_paused_ = false;
        a.read = true;
      }
      return a;
    });
    for (Admission::Ticket& ticket : done) service_->ReleaseTicket(ticket);
    Act(actions);
  }

  void OnCancel() override {
    Act(Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      broken_ = true;
      return Actions{};
    }));
  }

  void OnDone() override {
    const absl::StatusCode code = CodeSeenByClient(absl::Status(final_code_, ""), context_,
                                                   absl::FromChrono(context_->deadline()));
    service_->metrics_->RequestFinished("Batch", code, SecondsSince(accepted_));
    delete this;
  }

 private:
  // gRPC operations to start once mu_ is released.
  struct Actions {
    bool read = false;
    v1::BatchResponse* write = nullptr;
    bool finish = false;
  };

  template <typename Fn>
  Actions Locked(Fn fn) {
    absl::MutexLock lock(&mu_);
    Actions actions = fn();
    // Every item is answered (or dropped) and nothing is being written: the
    // stream can finish once the client has half-closed (or is gone).
    if (!finishing_ && !writing_ && outstanding_ == 0 && (reads_done_ || broken_)) {
      finishing_ = true;
      final_code_ = broken_ ? absl::StatusCode::kCancelled : absl::StatusCode::kOk;
      actions.finish = true;
      actions.read = false;
    }
    return actions;
  }

  // REQUIRES: mu_ not held. Finish comes last: `this` may be deleted after.
  void Act(const Actions& actions) {
    if (actions.read) StartRead(&request_);
    if (actions.write != nullptr) StartWrite(actions.write);
    if (actions.finish) {
      Finish(final_code_ == absl::StatusCode::kOk
                 ? grpc::Status::OK
                 : grpc::Status(grpc::StatusCode::CANCELLED, "the batch stream was cancelled"));
    }
  }

  // True while another item may be read ahead of the answers.
  bool WindowOpen() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return outstanding_ < service_->options_.batch_window &&
           outstanding_bytes_ < service_->options_.batch_window_bytes;
  }

  void RunItem(const v1::BatchRequest& item, const Call& call, int64_t item_bytes) {
    // Once the answer is published below, another thread may write it,
    // finish the stream and delete this reactor: after that point only
    // locals are touched (and `this` only by the thread handed a write or
    // the finish).
    ComputeService* const service = service_;
    auto response = std::make_unique<v1::BatchResponse>();
    Admission::Ticket ticket;
    absl::Status status;
    absl::string_view method;
    if (item.id().size() > kMaxBatchIdBytes) {
      // An unbounded id would be echoed into a response that may no longer
      // fit a message, failing the whole stream.
      response->set_id(item.id().substr(0, kMaxBatchIdBytes));
      method = "Batch/BadId";
      service_->LeaveQueue();
      status = absl::InvalidArgumentError(
          absl::StrCat("id: ", item.id().size(), " bytes; at most ", kMaxBatchIdBytes));
    } else {
      response->set_id(item.id());
    }
    switch (status.ok() ? item.op_case() : v1::BatchRequest::OP_NOT_SET) {
      case v1::BatchRequest::kGemm:
        method = "Batch/Gemm";
        status = service_->Execute(item.gemm(), response->mutable_gemm(), call, &ticket);
        break;
      case v1::BatchRequest::kGemv:
        method = "Batch/Gemv";
        status = service_->Execute(item.gemv(), response->mutable_gemv(), call, &ticket);
        break;
      case v1::BatchRequest::kReduce:
        method = "Batch/Reduce";
        status = service_->Execute(item.reduce(), response->mutable_reduce(), call, &ticket);
        break;
      case v1::BatchRequest::kTranspose:
        method = "Batch/Transpose";
        status = service_->Execute(item.transpose(), response->mutable_transpose(), call, &ticket);
        break;
      case v1::BatchRequest::kAttention:
        method = "Batch/Attention";
        status = service_->Execute(item.attention(), response->mutable_attention(), call, &ticket);
        break;
      case v1::BatchRequest::OP_NOT_SET:
        if (!status.ok()) break;  // the id was refused above
        method = "Batch/Unset";
        service_->LeaveQueue();
        status = absl::InvalidArgumentError(
            "op: missing; expected one of gemm, gemv, reduce, transpose, attention");
        break;
    }
    if (!status.ok()) {
      response->clear_result();
      const grpc::Status grpc_status = ToGrpcStatus(status);
      response->set_code(static_cast<int32_t>(grpc_status.error_code()));
      response->set_message(grpc_status.error_message());
    }
    service->metrics_->AddSentBytes(static_cast<int64_t>(response->ByteSizeLong()));
    service->metrics_->ItemFinished(method, status.code(), SecondsSince(call.accepted));
    bool dropped = false;
    const Actions actions = Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      Actions a;
      if (broken_) {
        --outstanding_;
        outstanding_bytes_ -= item_bytes;
        dropped = true;
        return a;
      }
      writes_.push_back(Pending{std::move(response), std::move(ticket), item_bytes});
      if (!writing_) {
        writing_ = true;
        a.write = writes_.front().response.get();
      }
      return a;
    });
    if (dropped) service->ReleaseTicket(ticket);
    // Counted as running until here, so a drain waits for the answer to be
    // queued; the write itself is awaited by grpc::Server::Shutdown.
    service->EndOp();
    Act(actions);
  }

  ComputeService* const service_;
  grpc::CallbackServerContext* const context_;
  const absl::Time accepted_;
  v1::BatchRequest request_;                             // the read in flight (one at a time)
  absl::StatusCode final_code_ = absl::StatusCode::kOk;  // set before Finish

  absl::Mutex mu_;
  // Items read and not yet answered (running, or queued for writing).
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t outstanding_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // request bytes of those items
  // Answers waiting to be written; the front one is being written when
  // writing_.
  struct Pending {
    std::unique_ptr<v1::BatchResponse> response;
    Admission::Ticket ticket;   // its bytes stay in flight until written
    int64_t request_bytes = 0;  // the item's share of the read-ahead window
  };
  std::deque<Pending> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  // The client is gone (cancelled, or a write failed): answers are dropped.
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
};

// A Batch stream refused at once (the server is draining).
class ComputeService::RejectedStream final
    : public grpc::ServerBidiReactor<v1::BatchRequest, v1::BatchResponse> {
 public:
  explicit RejectedStream(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

grpc::ServerBidiReactor<v1::BatchRequest, v1::BatchResponse>* ComputeService::Batch(
    grpc::CallbackServerContext* context) {
  if (absl::Status status = CheckAccepting("Batch"); !status.ok()) {
    return new RejectedStream(status);
  }
  return new BatchReactor(this, context);
}

}  // namespace gpucompute
