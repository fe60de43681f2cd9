#include "server/service/compute_service.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/descriptor.h"
#include "proto/wire.h"
#include "server/common/status_macros.h"
#include "server/core/cost.h"
#include "server/service/auth.h"
#include "server/service/convert.h"

#ifndef GPUCOMPUTE_VERSION
#define GPUCOMPUTE_VERSION "0.0.0-dev"
#endif

namespace gpucompute {
namespace {

// A unary request at most this large (resident operands, small inline ones)
// runs on the gRPC thread that received it while fewer than kMaxInlineOps
// others do: the hop to a worker thread costs more than a small operation.
constexpr int64_t kInlineRequestBytes = int64_t{64} << 10;
constexpr int kMaxInlineOps = 2;
// Reserved to receive a request that does not declare its size: enough for
// small requests; a larger one waits for the rest once it is in.
constexpr int64_t kUndeclaredRequestBytes = int64_t{1} << 20;

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

int64_t Twice(int64_t bytes) {
  return bytes > std::numeric_limits<int64_t>::max() / 2 ? std::numeric_limits<int64_t>::max()
                                                         : 2 * bytes;
}

// Host memory an operation holds from its request's arrival to its answer's
// sending: the most of its request received and decoded (2x the request),
// the request beside the result it computes, and the result beside its
// encoding (2x the result); the result is what FootprintBytes counts beyond
// the request.
int64_t HostBytes(int64_t request_bytes, int64_t footprint_bytes) {
  return Twice(std::max(request_bytes, footprint_bytes - request_bytes));
}

// The size a call's request declares (ComputeService::kRequestBytesMetadataKey), if any.
absl::StatusOr<std::optional<int64_t>> DeclaredRequestBytes(
    const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(ComputeService::kRequestBytesMetadataKey);
  if (it == metadata.end()) return std::nullopt;
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &bytes) ||
      bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(ComputeService::kRequestBytesMetadataKey,
                                                   " metadata: expected the request's size in "
                                                   "bytes (a decimal number >= 0)"));
  }
  return bytes;
}

// Decodes `raw` into `message` (a request), each large bytes field copied
// once into a string of its size: protobuf's own decoding grows a large
// string as it reads it, which held up to 1.6 times a 200 MiB tensor.
}  // namespace

absl::Status ComputeService::Decode(const grpc::ByteBuffer& raw, google::protobuf::Message* message,
                                    HostArena* arena, StagedTensors* staged) {
  std::vector<wire::ExternalField> external;
  RETURN_IF_ERROR(wire::Parse(raw, message, &external, wire::kDefaultMinExternalBytes, "request"));
  if (arena != nullptr && staged != nullptr) {
    std::vector<wire::ExternalField> rest;
    for (wire::ExternalField& field : external) {
      std::optional<HostArena::Block> block;
      const bool wanted = field.bytes.size() >= kMinStagedBytes &&
                          field.owner->GetDescriptor() == v1::Tensor::descriptor() &&
                          field.field->number() == v1::Tensor::kDataFieldNumber;
      if (wanted) block = arena->Take(size_t(field.bytes.size()));
      if (!block) {
        if (wanted) staged->missed_bytes += field.bytes.size();
        rest.push_back(std::move(field));
        continue;
      }
      field.bytes.CopyTo(0, field.bytes.size(), block->data());
      staged->arena_bytes += field.bytes.size();
      staged->blocks.emplace_back(field.owner, *std::move(block));
    }
    external = std::move(rest);
  }
  wire::Materialize(&external);
  return absl::OkStatus();
}

namespace {

// The index of `method` in the Compute service, as the generated code numbers
// its methods (their order in compute.proto).
int MethodIndex(absl::string_view method) {
  const google::protobuf::ServiceDescriptor* service =
      v1::GemmRequest::descriptor()->file()->FindServiceByName("Compute");
  return service->FindMethodByName(std::string(method))->index();
}

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
  // `staged` (may be null): the request's tensors decoded into the arena.
  StoreResolver(TensorStore& store, const std::string& owner, const StagedTensors* staged = nullptr)
      : store_(store), owner_(owner), staged_(staged) {}
  absl::StatusOr<TensorView> Resolve(const std::string& handle, const std::string& field) override {
    ASSIGN_OR_RETURN(std::shared_ptr<ResidentTensor> tensor, store_.Acquire(owner_, handle, field));
    const TensorView view = tensor->view();
    if (std::find(held_.begin(), held_.end(), tensor) == held_.end()) {
      held_.push_back(std::move(tensor));
    }
    return view;
  }
  std::optional<absl::string_view> StagedData(const v1::Tensor& tensor) override {
    if (staged_ == nullptr) return std::nullopt;
    for (const auto& [message, block] : staged_->blocks) {
      if (message == &tensor) return absl::string_view(block.data(), block.size());
    }
    return std::nullopt;
  }
  const std::vector<std::shared_ptr<ResidentTensor>>& held() const { return held_; }

 private:
  TensorStore& store_;
  const std::string& owner_;
  const StagedTensors* staged_;
  std::vector<std::shared_ptr<ResidentTensor>> held_;
};

}  // namespace

// One call of a unary operation or Echo, served as a stream: the handler
// runs once the call's headers are in, before gRPC has read any of the
// request. The call reserves admission for receiving the request (what it
// declares, or kUndeclaredRequestBytes holding receive_slot_), then reads
// it, waits for more if it is larger than reserved, decodes and runs it
// (Execute, on a worker or, small, right here), encodes the answer, lets go
// of everything else and holds the answer's bytes until it is sent (OnDone).
//
// Each step starts the next (a read, an admission wait, a task), so they run
// one after another, possibly on different threads; Finish comes last.
template <typename Request, typename Response>
class ComputeService::OpCall final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  OpCall(ComputeService* service, grpc::CallbackServerContext* context, absl::string_view method)
      : service_(service), method_(method), call_(service->StartCall(context)) {
    service_->BeginCall();
    if (absl::Status status = service_->CheckAccepting(method_); !status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    service_->metrics_->RequestStarted();
    service_->BeginOp();
    service_->EnterQueue();
    holding_.queued = true;
    absl::StatusOr<std::optional<int64_t>> declared = DeclaredRequestBytes(*context);
    if (!declared.ok()) {
      Fail(declared.status());
      return;
    }
    declared_ = *declared;
    const int64_t max_message = service_->options_.max_message_bytes;
    if (declared_.has_value() && max_message > 0 && *declared_ > max_message) {
      Fail(absl::ResourceExhaustedError(
          absl::StrCat("the request is ", *declared_, " bytes (", kRequestBytesMetadataKey,
                       "), more than the largest message of ", max_message,
                       " bytes (--max_message_bytes); refused before it was received")));
      return;
    }
    if (declared_.has_value() || service_->admission_->limit() <= 0) {
      Reserve(ReceiveBytes(declared_.value_or(0)));
      return;
    }
    HoldSlotThen([this] {
      Reserve(std::min(ReceiveBytes(kUndeclaredRequestBytes), service_->admission_->limit()));
    });
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Fail(call_.context->IsCancelled()
               ? absl::CancelledError("the call was cancelled")
               : absl::InvalidArgumentError("the call ended without a request message"));
      return;
    }
    holding_.request_bytes = static_cast<int64_t>(holding_.raw.Length());
    holding_.receive_seconds = SecondsSince(read_started_);
    service_->metrics_->AddReceivedBytes(holding_.request_bytes);
    service_->metrics_->ObserveStage("receive", holding_.receive_seconds);
    if (declared_.has_value() && holding_.request_bytes > *declared_) {
      Fail(absl::InvalidArgumentError(
          absl::StrCat("the request is ", holding_.request_bytes, " bytes, more than the ",
                       *declared_, " its ", kRequestBytesMetadataKey, " metadata declared")));
      return;
    }
    Continue();
  }

  void OnDone() override {
    if (answered_ != absl::InfinitePast()) {
      service_->metrics_->ObserveStage("send", SecondsSince(answered_));
    }
    ComputeService* const service = service_;
    delete this;  // gives back the admission the answer held
    service->EndCall();
  }

 private:
  // Holds receive_slot_ (waiting for it), then calls `then`.
  void HoldSlotThen(absl::AnyInvocable<void()> then) {
    if (holding_.slot.bytes() > 0) {
      then();
      return;
    }
    service_->WhenAdmitted(
        service_->receive_slot_, 1, call_,
        [this, then = std::move(then)](absl::StatusOr<Admission::Ticket> slot) mutable {
          if (!slot.ok()) {
            Fail(absl::Status(slot.status().code(),
                              absl::StrCat("waiting to be received (a request that does not "
                                           "declare its size in ",
                                           kRequestBytesMetadataKey,
                                           " metadata, or outgrew it, is received when no other "
                                           "such request is waiting): ",
                                           slot.status().message())));
            return;
          }
          holding_.slot = *std::move(slot);
          then();
        });
  }

  // Waits for `bytes` of admission, holds it, then calls `then` (fails the
  // call instead when admission is refused).
  template <typename Then>
  void AdmitThen(int64_t bytes, Then then) {
    service_->WhenAdmitted(*service_->admission_, bytes, call_,
                           [this, then](absl::StatusOr<Admission::Ticket> ticket) mutable {
                             if (!ticket.ok()) {
                               Fail(ticket.status());
                               return;
                             }
                             holding_.ticket = *std::move(ticket);
                             then();
                           });
  }

  // Waits for `bytes` of admission, then reads the request.
  void Reserve(int64_t bytes) {
    AdmitThen(bytes, [this] {
      read_started_ = absl::Now();
      StartRead(&holding_.raw);
    });
  }

  // The request is in: waits for more admission when it outgrew what was
  // reserved, else runs it.
  void Continue() {
    const int64_t needed = ReceiveBytes(holding_.request_bytes);
    if (service_->admission_->limit() > 0 && holding_.ticket.bytes() < needed) {
      Readmit(needed);
      return;
    }
    ComputeService* const service = service_;
    if (holding_.request_bytes <= kInlineRequestBytes && service->TryRunInline()) {
      Run();  // may finish the call and delete this
      service->DoneInline();
    } else {
      service->pool_->Schedule([this] { Run(); });
    }
  }

  // Gives the admission back and waits for `bytes` (holding the request's
  // bytes, and receive_slot_ for them), then continues.
  void Readmit(int64_t bytes) {
    holding_.ticket = Admission::Ticket();
    HoldSlotThen([this, bytes] { AdmitThen(bytes, [this] { Continue(); }); });
  }

  // Decodes and runs the request, on the calling thread.
  void Run() {
    if constexpr (std::is_same_v<Request, v1::EchoRequest>) {
      if (EchoAsReceived()) return;
    }
    auto request = std::make_unique<Request>();
    const absl::Time decode_start = absl::Now();
    // Echo's tensor goes back in its message: never into the arena.
    HostArena* const arena =
        std::is_same_v<Request, v1::EchoRequest> ? nullptr : service_->options_.request_arena;
    StagedTensors staged;
    if (absl::Status decoded = Decode(holding_.raw, request.get(), arena, &staged); !decoded.ok()) {
      Fail(decoded);
      return;
    }
    holding_.decode_seconds += SecondsSince(decode_start);
    if (arena != nullptr)
      service_->metrics_->AddStagedBytes(staged.arena_bytes, staged.missed_bytes);
    auto response = std::make_unique<Response>();
    holding_.staged = &staged;
    const absl::Status status = service_->Execute(*request, response.get(), call_, &holding_);
    holding_.staged = nullptr;
    staged.blocks.clear();  // the operation is done with them
    if (holding_.request_bytes >= kRecycleMessageBytes) RecycleTensorBytes(request.get());
    request.reset();  // its bytes go before the answer's are encoded
    if (status.ok() && holding_.more_bytes > 0) {
      const int64_t more = std::exchange(holding_.more_bytes, 0);
      Readmit(more);
      return;
    }
    if (!status.ok()) {
      Fail(status);
      return;
    }
    absl::StatusOr<grpc::ByteBuffer> encoded = EncodeAnswer(response.get());
    response.reset();
    if (!encoded.ok()) {
      Fail(encoded.status());
      return;
    }
    answer_ = *std::move(encoded);
    const int64_t answer_bytes = static_cast<int64_t>(answer_.Length());
    holding_.ticket.ShrinkTo(answer_bytes);
    service_->metrics_->AddSentBytes(answer_bytes);
    service_->metrics_->RequestFinished(method_, absl::StatusCode::kOk,
                                        SecondsSince(call_.accepted));
    service_->EndOp();
    answered_ = absl::Now();
    StartWriteAndFinish(&answer_, grpc::WriteOptions(), grpc::Status::OK);
  }

  // Echo of a plain request (one tensor with its bytes, nothing else):
  // an EchoRequest's encoding is that of an EchoResponse whose output is the
  // input, so the answer is the bytes as received with the timings after
  // them, not a byte copied. False, having done nothing, for any other
  // request (Run decodes it then, and names what is wrong).
  bool EchoAsReceived() {
    v1::EchoRequest request;
    std::vector<wire::ExternalField> external;
    if (!wire::Parse(holding_.raw, &request, &external, wire::kDefaultMinExternalBytes).ok() ||
        external.size() != 1 || external.front().owner != request.mutable_input() ||
        !request.GetReflection()->GetUnknownFields(request).empty() ||
        !request.input().GetReflection()->GetUnknownFields(request.input()).empty() ||
        !request.input().handle().empty()) {
      return false;
    }
    const v1::Tensor& input = request.input();
    absl::StatusOr<int64_t> bytes = TensorBytes(input.dtype(), input.shape(), "input");
    if (!bytes.ok() || *bytes != external.front().bytes.size()) return false;
    std::vector<grpc::Slice> slices;
    if (!holding_.raw.Dump(&slices).ok()) return false;
    external.clear();
    service_->Admitted(holding_.request_bytes, &holding_);  // the bytes stay, as the answer
    v1::EchoResponse timings;
    timings.mutable_timings()->set_server_seconds(SecondsSince(call_.accepted));
    timings.mutable_timings()->set_receive_seconds(holding_.receive_seconds);
    slices.emplace_back(timings.SerializeAsString());
    answer_ = grpc::ByteBuffer(slices.data(), slices.size());
    const int64_t answer_bytes = static_cast<int64_t>(answer_.Length());
    service_->metrics_->AddSentBytes(answer_bytes);
    service_->metrics_->RequestFinished(method_, absl::StatusCode::kOk,
                                        SecondsSince(call_.accepted));
    service_->EndOp();
    answered_ = absl::Now();
    StartWriteAndFinish(&answer_, grpc::WriteOptions(), grpc::Status::OK);
    return true;
  }

  // Ends the call with `status`; everything but the call itself is let go.
  void Fail(const absl::Status& status) {
    if (holding_.queued) service_->LeaveQueue();
    holding_.queued = false;
    holding_.ticket = Admission::Ticket();
    holding_.slot = Admission::Ticket();
    holding_.raw.Clear();
    service_->metrics_->RequestFinished(method_,
                                        CodeSeenByClient(status, call_.context, call_.deadline),
                                        SecondsSince(call_.accepted));
    service_->EndOp();
    Finish(ToGrpcStatus(status));
  }

  ComputeService* const service_;
  const absl::string_view method_;
  const Call call_;
  std::optional<int64_t> declared_;
  Holding holding_;
  grpc::ByteBuffer answer_;
  absl::Time read_started_ = absl::InfinitePast();
  absl::Time answered_ = absl::InfinitePast();
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
  ServeAsStream<v1::GemmRequest, v1::GemmResponse>("Gemm");
  ServeAsStream<v1::GemvRequest, v1::GemvResponse>("Gemv");
  ServeAsStream<v1::ReduceRequest, v1::ReduceResponse>("Reduce");
  ServeAsStream<v1::TransposeRequest, v1::TransposeResponse>("Transpose");
  ServeAsStream<v1::AttentionRequest, v1::AttentionResponse>("Attention");
  ServeAsStream<v1::EchoRequest, v1::EchoResponse>("Echo");
  ServeUnary<v1::ServerInfoRequest, v1::ServerInfoResponse>("GetServerInfo",
                                                            &ComputeService::GetServerInfoBody);
  ServeUnary<v1::FreeRequest, v1::FreeResponse>("Free", &ComputeService::FreeBody);
  ServeUnary<v1::ListTensorsRequest, v1::ListTensorsResponse>("ListTensors",
                                                              &ComputeService::ListTensorsBody);
  MarkMethodRawCallback(
      MethodIndex("Batch"),
      new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
          [this](grpc::CallbackServerContext* context) { return OpenBatch(context); }));
  watch_ = std::thread([this] { Watch(); });
}

template <typename Request, typename Response>
void ComputeService::ServeAsStream(absl::string_view method) {
  // gRPC reads a unary method's request before its handler runs; a
  // streaming one's only when the handler asks. Clients see no difference:
  // one message each way is the same on the wire.
  auto handler = [this, method] {
    return new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
        [this, method](grpc::CallbackServerContext* context) {
          return new OpCall<Request, Response>(this, context, method);
        });
  };
  const int index = MethodIndex(method);
  MarkMethodRawCallback(index, handler());
  MarkMethodStreamed(index, handler());
}

template <typename Request, typename Response>
void ComputeService::ServeUnary(absl::string_view method, UnaryBody<Request, Response> body) {
  MarkMethodRawCallback(
      MethodIndex(method),
      new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
          [this, method, body](grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
                               grpc::ByteBuffer* answer) {
            const absl::Time accepted = absl::Now();
            metrics_->RequestStarted();
            Request request;
            Response response;
            // A call that ended without a message leaves no buffer (an empty
            // message is an empty one).
            absl::Status status =
                raw->Valid()
                    ? Decode(*raw, &request)
                    : absl::InvalidArgumentError("the call ended without a request message");
            if (status.ok()) status = (this->*body)(*context, request, &response);
            if (status.ok()) *answer = wire::Serialize(response);
            metrics_->RequestFinished(method, status.code(), SecondsSince(accepted));
            grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
            reactor->Finish(ToGrpcStatus(status));
            return reactor;
          }));
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

int64_t ComputeService::ReceiveBytes(int64_t request_bytes) { return Twice(request_bytes); }

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

void ComputeService::WhenAdmitted(
    Admission& admission, int64_t bytes, const Call& call,
    absl::AnyInvocable<void(absl::StatusOr<Admission::Ticket>)> then) {
  // Set once AdmitAsync has returned: an admission after that goes to a
  // worker (the thread that made room must not run the rest of this call).
  // A refusal is told where it is decided: ending a call is quick, and it
  // must reach the client before the client's deadline. The wait gives up
  // once the call is abandoned (Abandoned, asked by Expire on the watch's
  // thread), and says why as AbandonedStatus does: UNAVAILABLE once
  // CancelOperations() was called. (The call is copied: cheap, and alive
  // for as long as the wait.)
  auto returned = std::make_shared<std::atomic<bool>>(false);
  admission.AdmitAsync(
      bytes, AdmissionDeadline(call), [this, call] { return Abandoned(call); },
      [this, call, returned,
       then = std::move(then)](absl::StatusOr<Admission::Ticket> ticket) mutable {
        if (!ticket.ok()) {
          if (absl::IsCancelled(ticket.status())) {
            if (absl::Status gone = AbandonedStatus(call, "before the operation started");
                !gone.ok()) {
              ticket = std::move(gone);
            }
          }
          then(std::move(ticket));
          return;
        }
        if (!returned->load()) {
          then(std::move(ticket));
          return;
        }
        pool_->Schedule([then = std::move(then), ticket = std::move(ticket)]() mutable {
          then(std::move(ticket));
        });
      });
  returned->store(true);
}

bool ComputeService::TryRunInline() {
  int running = inline_ops_.load();
  while (running < kMaxInlineOps) {
    if (inline_ops_.compare_exchange_weak(running, running + 1)) return true;
  }
  return false;
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

void ComputeService::Admitted(int64_t host_bytes, Holding* holding) {
  holding->ticket.ShrinkTo(host_bytes);
  holding->raw.Clear();
  holding->slot = Admission::Ticket();
  if (holding->queued) LeaveQueue();
  holding->queued = false;
}

template <typename Request, typename Response>
absl::Status ComputeService::Execute(const Request& request, Response* response, const Call& call,
                                     Holding* holding) {
  // An operation whose caller left while it waited (to be received, for
  // admission or for a worker) is not even validated; what it holds goes.
  if (absl::Status gone = AbandonedStatus(call, "before the operation started"); !gone.ok()) {
    Admitted(0, holding);
    return gone;
  }
  const absl::Time decode_start = absl::Now();
  StoreResolver handles(engine_->store(), call.owner, holding->staged);
  auto spec = Parse(request, options_.limits, &handles);
  // The request's bytes decoded into its message (before this call), then
  // parsed and validated here.
  const double decode_seconds = SecondsSince(decode_start) + holding->decode_seconds;
  // What came before, less the request's arrival and decoding: the wait for
  // admission (before and after receiving) and for a worker.
  const double receive_seconds = holding->receive_seconds;
  const double queue_seconds =
      std::max(0.0, SecondsSince(call.accepted) - decode_seconds - receive_seconds);
  if (!spec.ok()) {
    Admitted(0, holding);
    return spec.status();
  }
  const int64_t host_bytes = HostBytes(holding->request_bytes, FootprintBytes(*spec));
  const int64_t limit = admission_->limit();
  if (limit > 0 && host_bytes > holding->ticket.bytes()) {
    if (host_bytes > limit) {
      Admitted(0, holding);
      metrics_->ObserveQueue(queue_seconds);
      return absl::ResourceExhaustedError(absl::StrCat(
          "the request holds ", host_bytes,
          " bytes of host memory while it is served (its request received and decoded, its "
          "result and the result encoded), more than the in-flight limit of ",
          limit, " bytes (--max_inflight_bytes)"));
    }
    holding->more_bytes = host_bytes;
    return absl::OkStatus();
  }
  // Admitted in full: the operation leaves the queue (exactly once: the
  // holding remembers it) and holds what it needs.
  Admitted(host_bytes, holding);
  if (absl::Status gone = AbandonedStatus(call, "before the operation started"); !gone.ok()) {
    if (!absl::IsCancelled(gone)) metrics_->ObserveQueue(queue_seconds);
    return gone;
  }
  // Asked by the engine before each shard, by the devices' admission while
  // it waits and by CPU kernels between blocks: all of them within this
  // function.
  const CancelCheck abandoned = [this, &call] { return Abandoned(call); };
  // The devices' own admission waits no longer than the server's.
  CallContext call_context;
  call_context.deadline = AdmissionDeadline(call);
  call_context.cancelled = abandoned;
  call_context.owner = call.owner;
  call_context.resident = handles.held();
  absl::StatusOr<OpResult> result = Run(*engine_, *spec, call_context);
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
  timings->set_receive_seconds(receive_seconds);
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

absl::Status ComputeService::Execute(v1::EchoRequest& request, v1::EchoResponse* response,
                                     const Call& call, Holding* holding) {
  // The transport baseline: the tensor checked, then moved (not copied) into
  // the response. It holds what receiving it needed: the bytes as received
  // and decoded, then the response beside its encoding.
  Admitted(ReceiveBytes(holding->request_bytes), holding);
  if (!request.has_input()) {
    return absl::InvalidArgumentError("input: missing tensor; expected any valid tensor");
  }
  RETURN_IF_ERROR(ParseTensor(request.input(), "input").status());
  response->mutable_output()->Swap(request.mutable_input());
  response->mutable_timings()->set_server_seconds(SecondsSince(call.accepted));
  response->mutable_timings()->set_receive_seconds(holding->receive_seconds);
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

absl::Status ComputeService::GetServerInfoBody(grpc::CallbackServerContext& context,
                                               const v1::ServerInfoRequest& request,
                                               v1::ServerInfoResponse* response) {
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
  return absl::OkStatus();
}

absl::Status ComputeService::FreeBody(grpc::CallbackServerContext& context,
                                      const v1::FreeRequest& request, v1::FreeResponse* response) {
  std::vector<std::string> handles(request.handles().begin(), request.handles().end());
  ASSIGN_OR_RETURN(const int64_t freed, engine_->store().Free(OwnerOf(context), handles));
  response->set_freed_bytes(freed);
  return absl::OkStatus();
}

absl::Status ComputeService::ListTensorsBody(grpc::CallbackServerContext& context,
                                             const v1::ListTensorsRequest& request,
                                             v1::ListTensorsResponse* response) {
  int64_t used = 0;
  for (const ResidentInfo& info : engine_->store().List(OwnerOf(context), &used)) {
    ToProto(info, response->add_tensors());
  }
  response->set_used_bytes(used);
  response->set_quota_bytes(engine_->store().options().quota_bytes);
  return absl::OkStatus();
}

absl::Status ComputeService::ExecuteBatchItem(const v1::BatchRequest& item, const Call& call,
                                              v1::BatchResponse* response, Holding* holding,
                                              absl::string_view* method) {
  if (item.id().size() > kMaxBatchIdBytes) {
    // An unbounded id would be echoed into a response that may no longer
    // fit a message, failing the whole stream.
    response->set_id(item.id().substr(0, kMaxBatchIdBytes));
    *method = "Batch/BadId";
    Admitted(0, holding);
    return absl::InvalidArgumentError(
        absl::StrCat("id: ", item.id().size(), " bytes; at most ", kMaxBatchIdBytes));
  }
  response->set_id(item.id());
  switch (item.op_case()) {
    case v1::BatchRequest::kGemm:
      *method = "Batch/Gemm";
      return Execute(item.gemm(), response->mutable_gemm(), call, holding);
    case v1::BatchRequest::kGemv:
      *method = "Batch/Gemv";
      return Execute(item.gemv(), response->mutable_gemv(), call, holding);
    case v1::BatchRequest::kReduce:
      *method = "Batch/Reduce";
      return Execute(item.reduce(), response->mutable_reduce(), call, holding);
    case v1::BatchRequest::kTranspose:
      *method = "Batch/Transpose";
      return Execute(item.transpose(), response->mutable_transpose(), call, holding);
    case v1::BatchRequest::kAttention:
      *method = "Batch/Attention";
      return Execute(item.attention(), response->mutable_attention(), call, holding);
    case v1::BatchRequest::OP_NOT_SET:
      break;
  }
  *method = "Batch/Unset";
  Admitted(0, holding);
  return absl::InvalidArgumentError(
      "op: missing; expected one of gemm, gemv, reduce, transpose, attention");
}

}  // namespace gpucompute
