#include "server/service/compute_service.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/common/status_macros.h"
#include "server/core/cost.h"
#include "server/service/auth.h"
#include "server/service/convert.h"

#ifndef GPUCOMPUTE_VERSION
#define GPUCOMPUTE_VERSION "0.0.0-dev"
#endif

namespace gpucompute {
namespace {

// Longest BatchRequest.id accepted (it is echoed in the answer).
constexpr size_t kMaxBatchIdBytes = 1024;
// A unary request at most this large (resident operands, small inline ones)
// runs on the gRPC thread that received it while fewer than kMaxInlineOps
// others do: the hop to a worker thread costs more than a small operation.
constexpr size_t kInlineRequestBytes = size_t{64} << 10;
constexpr int kMaxInlineOps = 2;

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// Request type -> validated spec, and spec -> engine call.
absl::StatusOr<GemmSpec> Parse(const v1::GemmRequest& r, const Limits& l, HandleResolver* h) {
  return ParseGemm(r, l, h);
}
absl::StatusOr<GemvSpec> Parse(const v1::GemvRequest& r, const Limits& l, HandleResolver* h) {
  return ParseGemv(r, l, h);
}
absl::StatusOr<ReduceSpec> Parse(const v1::ReduceRequest& r, const Limits& l, HandleResolver* h) {
  return ParseReduce(r, l, h);
}
absl::StatusOr<TransposeSpec> Parse(const v1::TransposeRequest& r, const Limits& l,
                                    HandleResolver* h) {
  return ParseTranspose(r, l, h);
}
absl::StatusOr<AttentionSpec> Parse(const v1::AttentionRequest& r, const Limits& l,
                                    HandleResolver* h) {
  return ParseAttention(r, l, h);
}

absl::StatusOr<OpResult> Run(Engine& engine, const GemmSpec& spec, const CallContext& call) {
  return engine.Gemm(spec, call);
}
absl::StatusOr<OpResult> Run(Engine& engine, const GemvSpec& spec, const CallContext& call) {
  return engine.Gemv(spec, call);
}
absl::StatusOr<OpResult> Run(Engine& engine, const ReduceSpec& spec, const CallContext& call) {
  return engine.Reduce(spec, call);
}
absl::StatusOr<OpResult> Run(Engine& engine, const TransposeSpec& spec, const CallContext& call) {
  return engine.Transpose(spec, call);
}
absl::StatusOr<OpResult> Run(Engine& engine, const AttentionSpec& spec, const CallContext& call) {
  return engine.Attention(spec, call);
}

// Resolves handles in the store for one owner, holding what it resolved
// alive until the resolver goes.
class StoreResolver final : public HandleResolver {
 public:
  StoreResolver(TensorStore& store, const std::string& owner) : store_(store), owner_(owner) {}
  absl::StatusOr<TensorView> Resolve(const std::string& handle, const std::string& field) override {
    ASSIGN_OR_RETURN(std::shared_ptr<ResidentTensor> tensor, store_.Acquire(owner_, handle, field));
    const TensorView view = tensor->view();
    if (std::find(held_.begin(), held_.end(), tensor) == held_.end()) {
      held_.push_back(std::move(tensor));
    }
    return view;
  }
  const std::vector<std::shared_ptr<ResidentTensor>>& held() const { return held_; }

 private:
  TensorStore& store_;
  const std::string& owner_;
  std::vector<std::shared_ptr<ResidentTensor>> held_;
};

}  // namespace

// A unary call's reactor: finishes the call and, once gRPC is done with it,
// records how long sending the response took (when `observe_send`). The
// call counts as open (WaitIdle) until then.
class ComputeService::UnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(ComputeService* service, bool observe_send)
      : service_(service), observe_send_(observe_send) {
    service_->BeginCall();
  }
  void Finish(grpc::Status status) {
    finished_ = absl::Now();
    ServerUnaryReactor::Finish(std::move(status));
  }
  void OnDone() override {
    if (observe_send_ && finished_ != absl::InfinitePast()) {
      service_->metrics_->ObserveStage("send", SecondsSince(finished_));
    }
    service_->EndCall();
    delete this;
  }

 private:
  ComputeService* const service_;
  const bool observe_send_;
  absl::Time finished_ = absl::InfinitePast();
};

std::string ComputeService::OwnerOf(const grpc::CallbackServerContext& context) {
  std::string identity = CallIdentity(context);
  if (!identity.empty()) return identity;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("gpucompute-session");
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

ComputeService::ComputeService(Engine* engine, Admission* admission, WorkerPool* pool,
                               Metrics* metrics, ServiceOptions options)
    : engine_(engine),
      admission_(admission),
      pool_(pool),
      metrics_(metrics),
      options_(std::move(options)) {
  for (absl::string_view method :
       {"Gemm", "Gemv", "Reduce", "Transpose", "Attention", "Echo", "GetServerInfo", "Batch",
        "Upload", "Download", "Free", "ListTensors"}) {
    metrics_->AddMethod(method);
  }
  if (options_.stalled_stream_timeout != absl::InfiniteDuration()) {
    watch_ = std::thread([this] { WatchStalledStreams(); });
  }
}

ComputeService::~ComputeService() {
  {
    absl::MutexLock lock(&streams_mu_);
    stop_watch_ = true;
  }
  if (watch_.joinable()) watch_.join();
}

absl::Time ComputeService::AdmissionDeadline(const Call& call) {
  if (call.deadline == absl::InfiniteFuture()) return call.deadline;
  const absl::Duration margin =
      std::clamp((call.deadline - call.accepted) / 10, absl::Milliseconds(10), absl::Seconds(1));
  return call.deadline - margin;
}

ComputeService::Call ComputeService::StartCall(grpc::CallbackServerContext* context) const {
  return Call{context, absl::Now(), absl::FromChrono(context->deadline()), OwnerOf(*context)};
}

bool ComputeService::Abandoned(const Call& call) const {
  return cancel_operations_.load(std::memory_order_relaxed) || call.context->IsCancelled() ||
         absl::Now() >= call.deadline;
}

absl::Status ComputeService::AbandonedStatus(const Call& call, absl::string_view when) const {
  if (cancel_operations_.load(std::memory_order_relaxed)) {
    return absl::UnavailableError(
        absl::StrCat("the server is shutting down and stopped the operation ", when,
                     " (--shutdown_timeout); retry on another replica"));
  }
  if (call.context->IsCancelled()) return absl::CancelledError("the call was cancelled");
  if (absl::Now() >= call.deadline) {
    return absl::DeadlineExceededError(absl::StrCat("the deadline passed ", when));
  }
  return absl::OkStatus();
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

void ComputeService::BeginCall() {
  absl::MutexLock lock(&ops_mu_);
  ++open_calls_;
}

void ComputeService::EndCall() {
  absl::MutexLock lock(&ops_mu_);
  --open_calls_;
}

bool ComputeService::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&ops_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_) {
    return active_ops_ == 0 && open_calls_ == 0;
  };
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
  // An operation whose caller left while it waited for a worker is not
  // even decoded.
  RETURN_IF_ERROR(AbandonedStatus(call, "before the operation started"));
  const absl::Time decode_start = absl::Now();
  StoreResolver handles(engine_->store(), call.owner);
  ASSIGN_OR_RETURN(const auto spec, Parse(request, options_.limits, &handles));
  const double decode_seconds = SecondsSince(decode_start);
  const absl::Time admit_by = AdmissionDeadline(call);
  // Asked by admission while it waits, by the engine before each shard and
  // by CPU kernels between blocks: all of them within this function.
  const CancelCheck abandoned = [this, &call] { return Abandoned(call); };
  absl::StatusOr<Admission::Ticket> admitted =
      admission_->Admit(FootprintBytes(spec), admit_by, abandoned);
  const double queue_seconds = SecondsSince(call.accepted) - decode_seconds;
  if (!admitted.ok()) {
    metrics_->ObserveQueue(queue_seconds);
    if (absl::IsCancelled(admitted.status())) {
      RETURN_IF_ERROR(AbandonedStatus(call, "before the operation started"));
    }
    return admitted.status();
  }
  *ticket = *std::move(admitted);
  metrics_->AddInflightBytes(ticket->bytes());
  slot.Leave();
  if (absl::Status gone = AbandonedStatus(call, "before the operation started"); !gone.ok()) {
    if (!absl::IsCancelled(gone)) metrics_->ObserveQueue(queue_seconds);
    return gone;
  }
  // The devices' own admission waits no longer than the server's.
  CallContext call_context;
  call_context.deadline = admit_by;
  call_context.cancelled = abandoned;
  call_context.owner = call.owner;
  call_context.resident = handles.held();
  absl::StatusOr<OpResult> result = Run(*engine_, spec, call_context);
  // The wait for the devices' room is known only when the operation ran.
  metrics_->ObserveQueue(queue_seconds + (result.ok() ? result->device_wait_seconds : 0));
  if (!result.ok()) {
    if (on_no_healthy_device_ && !engine_->AnyHealthy()) on_no_healthy_device_();
    // Stopped part-way: say why.
    if (absl::IsCancelled(result.status())) {
      RETURN_IF_ERROR(AbandonedStatus(call, "while the operation ran"));
    }
    return result.status();
  }
  const absl::Time encode_start = absl::Now();
  // A kept result whose caller is gone (cancelled, or past its deadline)
  // would never be told its handle and stay until its lease ran out: it is
  // dropped unpublished instead. (A caller that goes just after this still
  // leaves its results to the lease.)
  const bool kept = result->kept_output != nullptr || result->kept_lse != nullptr;
  if (kept) RETURN_IF_ERROR(AbandonedStatus(call, "while the operation ran"));
  if (result->kept_output != nullptr) engine_->store().Publish(result->kept_output);
  if (result->kept_lse != nullptr) engine_->store().Publish(result->kept_lse);
  FillResponse(*result, response);
  v1::Timings* timings = response->mutable_timings();
  timings->set_queue_seconds(queue_seconds + result->device_wait_seconds);
  timings->set_decode_seconds(decode_seconds);
  timings->set_encode_seconds(SecondsSince(encode_start));
  timings->set_server_seconds(SecondsSince(call.accepted));
  StageSeconds stages;
  stages.queue = timings->queue_seconds();
  stages.decode = decode_seconds;
  stages.host_to_device = timings->host_to_device_seconds();
  stages.kernel = timings->kernel_seconds();
  stages.device_to_host = timings->device_to_host_seconds();
  stages.encode = timings->encode_seconds();
  metrics_->ObserveStages(stages);
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
  auto* reactor = new UnaryReactor(this, /*observe_send=*/true);
  bool run_here = false;
  if (request->ByteSizeLong() <= kInlineRequestBytes) {
    int running = inline_ops_.load();
    while (running < kMaxInlineOps && !run_here) {
      run_here = inline_ops_.compare_exchange_weak(running, running + 1);
    }
  }
  auto body = [this, method, call, request, response, reactor] {
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
  };
  if (run_here) {
    body();
    inline_ops_.fetch_sub(1);
  } else {
    pool_->Schedule(std::move(body));
  }
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
  if (absl::Status status = CheckAccepting("Echo"); !status.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  // Open until its answer is sent: a drain waits for that (WaitIdle).
  auto* reactor = new UnaryReactor(this, /*observe_send=*/false);
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

grpc::ServerUnaryReactor* ComputeService::Free(grpc::CallbackServerContext* context,
                                               const v1::FreeRequest* request,
                                               v1::FreeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time accepted = absl::Now();
  metrics_->RequestStarted();
  std::vector<std::string> handles(request->handles().begin(), request->handles().end());
  absl::StatusOr<int64_t> freed = engine_->store().Free(OwnerOf(*context), handles);
  if (freed.ok()) response->set_freed_bytes(*freed);
  metrics_->RequestFinished("Free", freed.status().code(), SecondsSince(accepted));
  reactor->Finish(ToGrpcStatus(freed.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::ListTensors(grpc::CallbackServerContext* context,
                                                      const v1::ListTensorsRequest* request,
                                                      v1::ListTensorsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time accepted = absl::Now();
  metrics_->RequestStarted();
  int64_t used = 0;
  for (const ResidentInfo& info : engine_->store().List(OwnerOf(*context), &used)) {
    ToProto(info, response->add_tensors());
  }
  response->set_used_bytes(used);
  response->set_quota_bytes(engine_->store().options().quota_bytes);
  metrics_->RequestFinished("ListTensors", absl::StatusCode::kOk, SecondsSince(accepted));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::Status ComputeService::ExecuteBatchItem(const v1::BatchRequest& item, const Call& call,
                                              v1::BatchResponse* response,
                                              Admission::Ticket* ticket,
                                              absl::string_view* method) {
  if (item.id().size() > kMaxBatchIdBytes) {
    // An unbounded id would be echoed into a response that may no longer
    // fit a message, failing the whole stream.
    response->set_id(item.id().substr(0, kMaxBatchIdBytes));
    *method = "Batch/BadId";
    LeaveQueue();
    return absl::InvalidArgumentError(
        absl::StrCat("id: ", item.id().size(), " bytes; at most ", kMaxBatchIdBytes));
  }
  response->set_id(item.id());
  switch (item.op_case()) {
    case v1::BatchRequest::kGemm:
      *method = "Batch/Gemm";
      return Execute(item.gemm(), response->mutable_gemm(), call, ticket);
    case v1::BatchRequest::kGemv:
      *method = "Batch/Gemv";
      return Execute(item.gemv(), response->mutable_gemv(), call, ticket);
    case v1::BatchRequest::kReduce:
      *method = "Batch/Reduce";
      return Execute(item.reduce(), response->mutable_reduce(), call, ticket);
    case v1::BatchRequest::kTranspose:
      *method = "Batch/Transpose";
      return Execute(item.transpose(), response->mutable_transpose(), call, ticket);
    case v1::BatchRequest::kAttention:
      *method = "Batch/Attention";
      return Execute(item.attention(), response->mutable_attention(), call, ticket);
    case v1::BatchRequest::OP_NOT_SET:
      break;
  }
  *method = "Batch/Unset";
  LeaveQueue();
  return absl::InvalidArgumentError(
      "op: missing; expected one of gemm, gemv, reduce, transpose, attention");
}

}  // namespace gpucompute
