// The resident-tensor streams: Upload (client streaming, one or several
// parts of one tensor in chunks) and Download (server streaming, a byte range
// in chunks). Both are served raw (proto/wire.h): an uploaded chunk's bytes
// go from gRPC's slices straight into the device's memory (Device::WriteFrom,
// staged through pinned memory on a GPU), and a downloaded chunk is read
// into a buffer that gRPC sends as it is. Each chunk is copied while gRPC
// receives or sends the next: the reactor keeps one read or write in flight
// while it copies the previous or next chunk.
//
// Each chunk holds admission (--max_inflight_bytes) for its bytes while the
// server holds them in host memory: an uploaded chunk from its arrival (the
// next is read once it is admitted) until it is copied, a downloaded one
// from before it is read until it is sent.
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/wire.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/service/compute_service.h"
#include "server/service/convert.h"

namespace gpucompute {
namespace {

// Download chunks: the default, and the bounds of what a client may ask.
constexpr int64_t kDefaultChunkBytes = int64_t{4} << 20;
constexpr int64_t kMaxChunkBytes = int64_t{64} << 20;
// Chunk bytes at least this long stay in gRPC's slices until copied.
constexpr int64_t kExternalBytes = int64_t{16} << 10;
// Uploads of tensors at least this large create them on a worker
// (UploadReactor::Received).
constexpr int64_t kCreateOnWorkerBytes = int64_t{64} << 20;

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

absl::Status Invalid(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

}  // namespace

// The parts of one upload, shared by the streams that carry them. The tensor
// is published once every part is in and the parts cover it exactly; a part
// that fails fails them all, and nothing is kept.
class ComputeService::UploadAssembly {
 public:
  UploadAssembly(std::shared_ptr<ResidentTensor> tensor, const v1::UploadHeader& header)
      : tensor_(std::move(tensor)), header_(header) {}

  // The tensor being assembled (null once the upload failed).
  std::shared_ptr<ResidentTensor> Tensor() {
    absl::MutexLock lock(&mu_);
    return tensor_;
  }
  const v1::UploadHeader& header() const { return header_; }
  int parts() const { return std::max(1, header_.parts()); }

  // Registers the part [begin, end) of a stream. INVALID_ARGUMENT when it
  // overlaps a part already registered, or the upload has failed.
  absl::Status AddPart(int64_t begin, int64_t end) {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    if (static_cast<int>(ranges_.size()) >= parts()) {
      return Invalid("header.parts", absl::StrCat("more than ", parts(), " streams joined"));
    }
    for (const auto& [b, e] : ranges_) {
      if (begin < e && b < end) {
        return Invalid("header.part_begin",
                       absl::StrCat("part [", begin, ", ", end, ") overlaps part [", b, ", ", e,
                                    ") of another stream"));
      }
    }
    ranges_.emplace_back(begin, end);
    return absl::OkStatus();
  }

  // `reactor` carried its whole part. Returns true when that completed the
  // upload: then the caller publishes the tensor and answers the streams
  // TakeWaiting returns. Otherwise `reactor` waits among them (under the
  // same lock: the last part cannot be taken in between). INVALID_ARGUMENT
  // when the parts do not cover the tensor; the error when the upload
  // failed.
  absl::StatusOr<bool> PartDone(UploadReactor* reactor) {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    if (++done_ < parts()) {
      waiting_.push_back(reactor);
      return false;
    }
    std::vector<std::pair<int64_t, int64_t>> sorted = ranges_;
    std::sort(sorted.begin(), sorted.end());
    int64_t next = 0;
    for (const auto& [b, e] : sorted) {
      if (b != next) break;
      next = e;
    }
    if (next != tensor_->bytes()) {
      error_ = Invalid("header.part_begin",
                       absl::StrCat("the ", parts(), " parts do not cover the tensor's ",
                                    tensor_->bytes(), " bytes (covered from 0 to ", next, ")"));
      return error_;
    }
    return true;
  }

  // The upload failed; the first error is kept. `self` (the failing stream)
  // stops waiting. Returns the other streams waiting for the end, each held
  // (UploadReactor::Hold): the caller finishes each with the error, then
  // releases it.
  std::vector<UploadReactor*> Fail(absl::Status error, UploadReactor* self);
  absl::Status error() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }

  // The streams waiting for the end, once it has come, each held: the caller
  // answers each, then releases it.
  std::vector<UploadReactor*> TakeWaiting();
  // Drops the tensor (failed uploads keep nothing).
  void Drop() {
    absl::MutexLock lock(&mu_);
    tensor_.reset();
  }

 private:
  std::shared_ptr<ResidentTensor> tensor_;
  const v1::UploadHeader header_;
  mutable absl::Mutex mu_;
  std::vector<std::pair<int64_t, int64_t>> ranges_ ABSL_GUARDED_BY(mu_);
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<UploadReactor*> waiting_ ABSL_GUARDED_BY(mu_);
};

// One Upload stream: reads the header, then chunk after chunk, each written
// into the tensor while the next is being received.
class ComputeService::UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadReactor(ComputeService* service, grpc::CallbackServerContext* context,
                grpc::ByteBuffer* response)
      : service_(service),
        context_(context),
        response_(response),
        owner_(OwnerOf(*context)),
        call_(service->StartCall(context)) {
    service_->BeginCall();
    service_->metrics_->RequestStarted();
    if (service_->draining_) {
      FinishOnce(absl::UnavailableError("the server is shutting down; retry on another replica"));
      return;
    }
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::Status failed;
      std::optional<ResidentInfo> completed;
      {
        absl::MutexLock order(&copy_mu_);
        failed = EndOfStream();
        if (!failed.ok()) failed = Abort(failed);
        completed = completed_;
      }
      // Outside copy_mu_: once finished, the reactor may be deleted.
      Finished(failed, completed);
      return;
    }
    // The chunk waits in gRPC's slices for admission; the next is read once
    // it is admitted.
    auto raw = std::make_shared<grpc::ByteBuffer>();
    raw->Swap(&incoming_);
    {
      absl::MutexLock lock(&finish_mu_);
      if (finished_) return;  // answered already (cancelled, say): the chunk is dropped
      ++admissions_;          // until Received has run (AdmissionDone)
    }
    service_->WhenAdmitted(*service_->admission_, static_cast<int64_t>(raw->Length()), call_,
                           [this, raw](absl::StatusOr<Admission::Ticket> ticket) {
                             Received(raw, std::move(ticket), /*on_worker=*/false);
                           });
  }

  void OnCancel() override {
    absl::Status cancelled = absl::CancelledError("the upload stream was cancelled");
    {
      absl::MutexLock order(&copy_mu_);
      cancelled = Abort(cancelled);
    }
    FinishOnce(cancelled);
  }

  void OnDone() override {
    service_->metrics_->RequestFinished("Upload", final_code_, SecondsSince(accepted_));
    bool gone;
    {
      absl::MutexLock lock(&finish_mu_);
      done_ = true;
      gone = holds_ == 0;
    }
    // Else the last Release deletes the reactor.
    if (gone) Delete();
  }

  // Keeps the reactor alive past OnDone until the matching Release, for
  // another stream about to answer this one (UploadAssembly hands out
  // waiting streams held).
  void Hold() {
    absl::MutexLock lock(&finish_mu_);
    ++holds_;
  }
  // Ends a Hold; the last one after OnDone deletes the reactor, so the caller
  // must not touch it afterwards.
  void Release() {
    bool gone;
    {
      absl::MutexLock lock(&finish_mu_);
      gone = --holds_ == 0 && done_;
    }
    if (gone) Delete();
  }

  // The upload this stream belongs to ended: answers with `info` or the
  // error, unless the stream has already been answered (cancelled, say).
  // The response is written only by the one call that answers. While a
  // chunk waits for admission the answer waits too (AdmissionDone sends it):
  // the wait asks the call's context (Abandoned), which ends with the call.
  void Complete(const absl::StatusOr<ResidentInfo>& info) {
    {
      absl::MutexLock lock(&finish_mu_);
      if (finished_) return;
      finished_ = true;
      final_code_ = info.status().code();
      if (info.ok()) {
        v1::UploadResponse response;
        ToProto(*info, response.mutable_tensor());
        response.set_receive_seconds(receive_seconds_);
        response.set_host_to_device_seconds(h2d_seconds_);
        *response_ = wire::Serialize(response);
      }
      if (admissions_ > 0) {
        unsent_ = ToGrpcStatus(info.status());
        return;
      }
    }
    Finish(ToGrpcStatus(info.status()));
  }

 private:
  // A chunk's admission came (or was refused): copies the chunk where it
  // belongs while the next is received, then gives the admission back.
  // `on_worker`: called on a worker of the pool, not on a gRPC thread (where
  // an admission that comes at once runs it).
  void Received(std::shared_ptr<grpc::ByteBuffer> raw, absl::StatusOr<Admission::Ticket> ticket,
                bool on_worker) {
    absl::Status failed;
    std::optional<ResidentInfo> completed;
    bool to_worker = false;
    {
      absl::MutexLock order(&copy_mu_);
      if (!ticket.ok()) {
        failed = ticket.status();
      } else if (!aborted_) {  // an aborted stream (cancelled, say) joins nothing
        if (first_ == absl::InfinitePast()) first_ = absl::Now();
        v1::UploadRequest chunk;
        std::vector<wire::ExternalField> external;
        failed = wire::Parse(*raw, &chunk, &external, kExternalBytes, "request");
        to_worker = failed.ok() && !on_worker && CreatesLargeTensor(chunk);
        if (!to_worker) {
          if (failed.ok()) failed = CheckHeader(chunk);
          if (failed.ok()) {
            StartRead(&incoming_);
            failed = Copy(chunk, external);
          }
        }
      }
      if (!to_worker) {
        raw->Clear();
        if (!failed.ok()) failed = Abort(failed);
        completed = completed_;
      }
    }
    if (to_worker) {
      // Creating a large tensor takes long (on the CPU backend the host
      // memory is zeroed: 5-22 s for 8 GiB on a 2-core machine), too long
      // for a gRPC thread: the connection it serves stops answering, and
      // the client's keepalive drops it. The chunk is taken again on a
      // worker, still holding its admission (and counted in admissions_).
      service_->pool_->Schedule([this, raw = std::move(raw), ticket = std::move(ticket)]() mutable {
        Received(std::move(raw), std::move(ticket), /*on_worker=*/true);
      });
      return;
    }
    if (ticket.ok()) *ticket = Admission::Ticket();  // the chunk's bytes are gone
    Finished(failed, completed);
    AdmissionDone();
  }

  // A chunk's admission callback has run: sends the answer that waited for
  // it, if any. The reactor may be gone once this returns.
  void AdmissionDone() {
    std::optional<grpc::Status> answer;
    {
      absl::MutexLock lock(&finish_mu_);
      if (--admissions_ == 0) answer.swap(unsent_);
    }
    if (answer.has_value()) Finish(*answer);
  }

  // Whether `chunk` is a stream's first message and creates a tensor of at
  // least kCreateOnWorkerBytes (joining an upload begun by another stream
  // creates nothing, but is rare enough to be taken the same way).
  bool CreatesLargeTensor(const v1::UploadRequest& chunk) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_) {
    if (assembly_ != nullptr || !chunk.has_header()) return false;
    absl::StatusOr<UploadPart> part = ParseUploadHeader(chunk.header());
    return part.ok() && part->bytes >= kCreateOnWorkerBytes;
  }

  // Finishes with `failed`, or answers once the upload completed
  // (`completed`, read under copy_mu_). REQUIRES: copy_mu_ not held.
  void Finished(const absl::Status& failed, const std::optional<ResidentInfo>& completed) {
    if (!failed.ok()) {
      FinishOnce(failed);
    } else if (completed.has_value()) {
      Complete(*completed);
    }
  }

  void Delete() {
    ComputeService* const service = service_;
    delete this;
    service->EndCall();
  }

  // Validates the header and creates (or joins) the upload.
  absl::Status Begin(const v1::UploadRequest& first) {
    if (!first.has_header()) return Invalid("header", "missing in the first message");
    const v1::UploadHeader& h = first.header();
    ASSIGN_OR_RETURN(const UploadPart part, ParseUploadHeader(h));
    begin_ = part.begin;
    end_ = part.end;
    next_ = begin_;
    ASSIGN_OR_RETURN(std::shared_ptr<UploadAssembly> assembly, service_->JoinUpload(owner_, h));
    tensor_ = assembly->Tensor();
    if (tensor_ == nullptr) return assembly->error();
    assembly_ = std::move(assembly);
    return assembly_->AddPart(begin_, end_);
  }

  // Starts the upload on the stream's first message; a later one carries no
  // header.
  absl::Status CheckHeader(const v1::UploadRequest& chunk) {
    if (assembly_ == nullptr) return Begin(chunk);
    if (chunk.has_header()) {
      return Invalid("header", "only the first message of a stream carries one");
    }
    return absl::OkStatus();
  }

  // Writes one chunk's bytes where they belong: from the message, or (a
  // large chunk) straight from gRPC's slices.
  absl::Status Copy(const v1::UploadRequest& chunk,
                    const std::vector<wire::ExternalField>& external) {
    // `data` is the message's only bytes field: any external one is it.
    const wire::SliceBytes* slices = external.empty() ? nullptr : &external.front().bytes;
    const int64_t n =
        slices != nullptr ? slices->size() : static_cast<int64_t>(chunk.data().size());
    if (n == 0) return absl::OkStatus();
    if (chunk.offset() != next_) {
      return Invalid("offset",
                     absl::StrCat("expected ", next_,
                                  " (chunks come in order, each where the previous ended) but "
                                  "got ",
                                  chunk.offset()));
    }
    if (n > end_ - next_) {
      return Invalid("data", absl::StrCat("bytes [", next_, ", ", next_ + n,
                                          ") pass the end of the stream's part at ", end_));
    }
    if (slices != nullptr) {
      RETURN_IF_ERROR(service_->engine_->store().WriteFrom(
          *tensor_, next_, n,
          [slices](int64_t at, int64_t len, void* dst) { slices->CopyTo(at, len, dst); },
          &h2d_seconds_));
    } else {
      RETURN_IF_ERROR(
          service_->engine_->store().Write(*tensor_, next_, chunk.data().data(), n, &h2d_seconds_));
    }
    next_ += n;
    service_->metrics_->AddReceivedBytes(n);
    service_->metrics_->AddUploadedBytes(n);
    return absl::OkStatus();
  }

  // The client half-closed (or went away). Returns the error to finish
  // with; OK when this stream is done (answered, or waiting for the other
  // parts). REQUIRES: copy_mu_ held.
  absl::Status EndOfStream() ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_) {
    if (aborted_) return absl::OkStatus();  // already finished
    if (context_->IsCancelled()) return absl::CancelledError("the upload stream was cancelled");
    if (assembly_ == nullptr) return Invalid("header", "the stream ended before its first message");
    if (next_ != end_) {
      return Invalid("data", absl::StrCat("the stream ended at byte ", next_,
                                          ", short of its part's end at ", end_));
    }
    receive_seconds_ = SecondsSince(first_);
    service_->metrics_->ObserveStage("receive", receive_seconds_);
    ASSIGN_OR_RETURN(const bool complete, assembly_->PartDone(this));
    // Else the other parts will answer this stream (or its cancellation will).
    if (!complete) return absl::OkStatus();
    service_->FinishUpload(owner_, assembly_);
    const ResidentInfo info = service_->engine_->store().Publish(tensor_);
    for (UploadReactor* other : assembly_->TakeWaiting()) {
      other->Complete(info);
      other->Release();
    }
    completed_ = info;  // this stream finishes once copy_mu_ is released
    return absl::OkStatus();
  }

  // Fails the upload this stream belongs to (the tensor is dropped) and the
  // other streams waiting on it; returns the error this stream finishes with.
  // REQUIRES: copy_mu_ held.
  absl::Status Abort(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(copy_mu_) {
    aborted_ = true;
    if (assembly_ != nullptr) {
      std::vector<UploadReactor*> others = assembly_->Fail(status, this);
      service_->FinishUpload(owner_, assembly_);
      assembly_->Drop();
      tensor_.reset();
      const absl::Status part_failed =
          status.code() == absl::StatusCode::kCancelled
              ? absl::AbortedError("another part of this upload was cancelled")
              : absl::AbortedError(
                    absl::StrCat("another part of this upload failed: ", status.message()));
      for (UploadReactor* other : others) {
        other->FinishOnce(part_failed);
        other->Release();
      }
    }
    return status;
  }

  void FinishOnce(const absl::Status& status) { Complete(status); }

  ComputeService* const service_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;
  const std::string owner_;
  const Call call_;
  const absl::Time accepted_ = absl::Now();
  grpc::ByteBuffer incoming_;  // the read in flight

  absl::Mutex copy_mu_;  // chunks are copied one at a time, in order
  bool aborted_ = false;
  std::shared_ptr<UploadAssembly> assembly_;
  std::shared_ptr<ResidentTensor> tensor_;  // held while this stream writes
  int64_t begin_ = 0, end_ = 0, next_ = 0;  // the part, and the next byte expected
  absl::Time first_ = absl::InfinitePast();
  double receive_seconds_ = 0;
  double h2d_seconds_ = 0;
  std::optional<ResidentInfo> completed_;  // set when this stream completed the upload

  absl::Mutex finish_mu_;
  bool finished_ ABSL_GUARDED_BY(finish_mu_) = false;
  // Chunks whose admission callback is still to come (two at most: a
  // chunk's callback reads the next before copying its own), and the answer
  // that waits for them.
  int admissions_ ABSL_GUARDED_BY(finish_mu_) = 0;
  std::optional<grpc::Status> unsent_ ABSL_GUARDED_BY(finish_mu_);
  // Holds (streams about to answer this one), and gRPC done with the stream
  // (OnDone): whichever ends last deletes the reactor.
  int holds_ ABSL_GUARDED_BY(finish_mu_) = 0;
  bool done_ ABSL_GUARDED_BY(finish_mu_) = false;
  absl::StatusCode final_code_ = absl::StatusCode::kOk;
};

std::vector<ComputeService::UploadReactor*> ComputeService::UploadAssembly::Fail(
    absl::Status error, UploadReactor* self) {
  absl::MutexLock lock(&mu_);
  if (error_.ok()) error_ = std::move(error);
  std::vector<UploadReactor*> others;
  for (UploadReactor* reactor : waiting_) {
    if (reactor == self) continue;
    reactor->Hold();
    others.push_back(reactor);
  }
  waiting_.clear();
  return others;
}

std::vector<ComputeService::UploadReactor*> ComputeService::UploadAssembly::TakeWaiting() {
  absl::MutexLock lock(&mu_);
  std::vector<UploadReactor*> waiting = std::move(waiting_);
  waiting_.clear();
  for (UploadReactor* reactor : waiting) reactor->Hold();
  return waiting;
}

absl::StatusOr<std::shared_ptr<ComputeService::UploadAssembly>> ComputeService::JoinUpload(
    const std::string& owner, const v1::UploadHeader& header) {
  const bool single = header.parts() <= 1;
  absl::MutexLock lock(&uploads_mu_);
  if (!single) {
    auto it = uploads_.find({owner, header.upload_id()});
    if (it != uploads_.end()) {
      const v1::UploadHeader& first = it->second->header();
      if (first.dtype() != header.dtype() || first.parts() != header.parts() ||
          !std::equal(first.shape().begin(), first.shape().end(), header.shape().begin(),
                      header.shape().end()) ||
          first.has_device() != header.has_device() || first.device() != header.device()) {
        return Invalid("header", absl::StrCat("upload ", Quote(header.upload_id()),
                                              " is in progress with another dtype, shape, "
                                              "device or number of parts"));
      }
      return it->second;
    }
  }
  std::optional<int> device;
  if (header.has_device()) device = header.device();
  std::vector<int64_t> shape(header.shape().begin(), header.shape().end());
  ASSIGN_OR_RETURN(std::shared_ptr<ResidentTensor> tensor,
                   engine_->store().Create(owner, *ParseDType(header.dtype(), "header.dtype"),
                                           std::move(shape), device, "header.device"));
  auto assembly = std::make_shared<UploadAssembly>(std::move(tensor), header);
  if (!single) uploads_[{owner, header.upload_id()}] = assembly;
  return assembly;
}

std::shared_ptr<ResidentTensor> ComputeService::FinishUpload(
    const std::string& owner, const std::shared_ptr<UploadAssembly>& assembly) {
  if (assembly->parts() > 1) {
    absl::MutexLock lock(&uploads_mu_);
    auto it = uploads_.find({owner, assembly->header().upload_id()});
    if (it != uploads_.end() && it->second == assembly) uploads_.erase(it);
  }
  return assembly->Tensor();
}

// One Download stream: the byte range in chunks. Each chunk is read from the
// device into a buffer of its own that gRPC sends without a copy; the next
// chunk is read while the previous one is being sent (one write in flight,
// one chunk ready behind it).
class ComputeService::DownloadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  DownloadReactor(ComputeService* service, grpc::CallbackServerContext* context,
                  const grpc::ByteBuffer& request)
      : service_(service), call_(service->StartCall(context)) {
    service_->BeginCall();
    service_->metrics_->RequestStarted();
    absl::Status status =
        service_->draining_
            ? absl::UnavailableError("the server is shutting down; retry on another replica")
            : Start(OwnerOf(*context), request);
    if (!status.ok()) {
      Done(status);
      return;
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    bool finish = false, write = false;
    absl::Status status;
    Admission::Ticket written;  // the chunk's admission, given back after mu_
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      in_flight_.Clear();
      written = std::move(in_flight_ticket_);
      if (!ok) {
        if (error_.ok()) error_ = absl::CancelledError("the download stream broke");
      } else {
        service_->metrics_->AddSentBytes(writing_bytes_);
        service_->metrics_->AddDownloadedBytes(writing_bytes_);
        if (ready_.has_value() && error_.ok()) {
          TakeChunk(std::move(*ready_));
          ready_.reset();
          write = true;
        }
      }
      if (!writing_ && !preparing_ && (!error_.ok() || (next_ >= end_ && !ready_.has_value()))) {
        finish = true;
        status = error_;
        if (status.ok()) service_->metrics_->ObserveStage("send", SecondsSince(started_));
      }
    }
    if (write) StartWrite(&in_flight_);
    if (finish) {
      Done(status);
      return;
    }
    Pump();
  }

  void OnDone() override {
    service_->metrics_->RequestFinished("Download", final_code_, SecondsSince(accepted_));
    service_->EndCall();
    delete this;
  }

 private:
  struct Chunk {
    grpc::ByteBuffer message;
    int64_t bytes = 0;
    Admission::Ticket ticket;  // its admission, until it is sent
  };

  absl::Status Start(const std::string& owner, const grpc::ByteBuffer& raw) {
    v1::DownloadRequest request;
    std::vector<wire::ExternalField> external;
    RETURN_IF_ERROR(
        wire::Parse(raw, &request, &external, wire::kDefaultMinExternalBytes, "request"));
    wire::Materialize(&external);
    ASSIGN_OR_RETURN(tensor_,
                     service_->engine_->store().Acquire(owner, request.handle(), "handle"));
    const int64_t size = tensor_->bytes();
    if (request.offset() < 0 || request.offset() > size) {
      return Invalid("offset", absl::StrCat("expected 0 to ", size,
                                            " (the tensor's bytes) but got ", request.offset()));
    }
    if (request.length() < 0 || request.length() > size - request.offset()) {
      return Invalid("length", absl::StrCat("expected 0 to ", size - request.offset(), " but got ",
                                            request.length()));
    }
    if (request.chunk_bytes() < 0 || request.chunk_bytes() > kMaxChunkBytes) {
      return Invalid("chunk_bytes",
                     absl::StrCat("expected 0 (the server's choice) to ", kMaxChunkBytes,
                                  " but got ", request.chunk_bytes()));
    }
    chunk_ = request.chunk_bytes() == 0 ? kDefaultChunkBytes : request.chunk_bytes();
    next_ = request.offset();
    end_ = request.length() == 0 ? size : request.offset() + request.length();
    started_ = absl::Now();
    return absl::OkStatus();
  }

  // Reads a chunk while there is room for one behind the write in flight,
  // once it is admitted (Prepared reads it and pumps again), starting each
  // write that can start. Only one chunk is prepared at a time.
  void Pump() {
    int64_t offset, n;
    bool first;
    {
      absl::MutexLock lock(&mu_);
      if (preparing_ || !error_.ok() || ready_.has_value() || (next_ >= end_ && !first_)) return;
      preparing_ = true;
      offset = next_;
      n = std::min(chunk_, end_ - next_);
      first = first_;
      first_ = false;
      next_ += n;
    }
    service_->WhenAdmitted(*service_->admission_, n, call_,
                           [this, offset, n, first](absl::StatusOr<Admission::Ticket> ticket) {
                             Prepared(offset, n, first, std::move(ticket));
                           });
  }

  // The admission of the chunk [offset, offset + n) came (or was refused):
  // reads it and writes it, or keeps it ready behind the write in flight.
  void Prepared(int64_t offset, int64_t n, bool first, absl::StatusOr<Admission::Ticket> ticket) {
    absl::StatusOr<Chunk> chunk = absl::UnknownError("not read");
    if (!ticket.ok()) {
      chunk = ticket.status();
    } else {
      chunk = Read(offset, n, first);
      if (chunk.ok()) chunk->ticket = *std::move(ticket);
    }
    bool finish = false, write = false;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      preparing_ = false;
      if (!chunk.ok()) {
        if (error_.ok()) error_ = chunk.status();
      } else if (error_.ok()) {
        if (!writing_) {
          TakeChunk(std::move(*chunk));
          write = true;
        } else {
          ready_ = std::move(*chunk);
        }
      }
      if (!error_.ok() && !writing_) {
        finish = true;
        status = error_;
      }
    }
    chunk = absl::CancelledError("");  // a chunk not kept gives its admission back
    if (write) StartWrite(&in_flight_);
    if (finish) {
      Done(status);
      return;
    }
    Pump();
  }

  // The message of the bytes [offset, offset + n), with the tensor's
  // description in the first.
  absl::StatusOr<Chunk> Read(int64_t offset, int64_t n, bool first) {
    v1::DownloadResponse message;
    if (first) ToProto(service_->engine_->store().Info(*tensor_), message.mutable_tensor());
    message.set_offset(offset);
    std::shared_ptr<char[]> data(new char[static_cast<size_t>(std::max<int64_t>(n, 1))]);
    double seconds = 0;
    RETURN_IF_ERROR(service_->engine_->store().Read(*tensor_, offset, data.get(), n, &seconds));
    {
      absl::MutexLock lock(&mu_);
      d2h_seconds_ += seconds;
    }
    Chunk chunk;
    chunk.bytes = n;
    chunk.message = wire::Serialize(
        message,
        {{{wire::Field(v1::DownloadResponse::descriptor(), "data")}, data.get(), n, data}});
    return chunk;
  }

  // Makes `chunk` the write in flight; the caller starts it once mu_ is
  // released (in_flight_ is not touched until OnWriteDone).
  void TakeChunk(Chunk chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    writing_bytes_ = chunk.bytes;
    in_flight_ = std::move(chunk.message);
    in_flight_ticket_ = std::move(chunk.ticket);
  }

  void Done(const absl::Status& status) {
    final_code_ = status.code();
    Finish(ToGrpcStatus(status));
  }

  ComputeService* const service_;
  const Call call_;
  const absl::Time accepted_ = absl::Now();
  std::shared_ptr<ResidentTensor> tensor_;
  int64_t chunk_ = kDefaultChunkBytes, end_ = 0;
  absl::Time started_ = absl::InfinitePast();
  absl::StatusCode final_code_ = absl::StatusCode::kOk;

  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  bool preparing_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t writing_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ByteBuffer in_flight_;  // being written (owned by the write while writing_)
  Admission::Ticket in_flight_ticket_ ABSL_GUARDED_BY(mu_);  // in_flight_'s admission
  std::optional<Chunk> ready_ ABSL_GUARDED_BY(mu_);  // read, waiting for the write
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  double d2h_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

grpc::ServerReadReactor<grpc::ByteBuffer>* ComputeService::Upload(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new UploadReactor(this, context, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ComputeService::Download(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new DownloadReactor(this, context, *request);
}

}  // namespace gpucompute
