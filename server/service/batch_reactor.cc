// The Batch RPC: one bidirectional stream of operations, each answered with
// its own code as it finishes (ComputeService::Batch).
#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/grpc.h"
#include "proto/wire.h"
#include "server/service/compute_service.h"
#include "server/service/convert.h"

namespace gpucompute {

// One Batch stream. Items are read (at most batch_window items and
// batch_window_bytes ahead of their answers being written), run concurrently
// on the pool, and answered as they finish, one write in flight at a time
// with a queue behind it. A failed item is answered with its own code; the
// stream finishes OK after the client's half-close once every item is
// answered.
//
// Items are read raw and stay in gRPC's slices until admitted; the next item
// is read once the one before is admitted, so a stream holds at most one
// item outside admission. An item holds its admission until its answer is
// written, shrunk once computed to the encoded answer's bytes: a client that
// reads slowly holds only its own answers' bytes, and its window fills and
// its stream stops reading. A stream whose write in flight has waited
// stalled_stream_timeout (its client does not read) is ended
// RESOURCE_EXHAUSTED by the service's watch (Watch) and its answers dropped.
//
// gRPC may run reactions concurrently, so the state is under mu_; gRPC
// operations (StartRead, StartWrite, Finish) are started after mu_ is
// released, each decided under it by exactly one party.
class ComputeService::BatchReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  BatchReactor(ComputeService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), accepted_(absl::Now()) {
    service_->BeginCall();
    service_->metrics_->RequestStarted();
    service_->WatchStream(this);
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
    auto item = std::make_shared<Item>();
    item->holding.raw.Swap(&request_);
    item->holding.request_bytes = static_cast<int64_t>(item->holding.raw.Length());
    item->call =
        Call{context_, absl::Now(), absl::FromChrono(context_->deadline()), OwnerOf(*context_)};
    service_->metrics_->AddReceivedBytes(item->holding.request_bytes);
    bool run = false;
    Act(Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (broken_) return Actions{};  // nobody is listening; stop reading
      run = true;
      ++outstanding_;
      outstanding_bytes_ += item->holding.request_bytes;
      return Actions{};
    }));
    if (!run) return;
    service_->BeginOp();
    service_->EnterQueue();
    item->holding.queued = true;
    // The next item is read once this one is admitted.
    service_->WhenAdmitted(*service_->admission_, ReceiveBytes(item->holding.request_bytes),
                           item->call, [this, item](absl::StatusOr<Admission::Ticket> ticket) {
                             // The item keeps the stream open (outstanding_)
                             // until Admit answers it.
                             Act(Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                               Actions a;
                               if (broken_) return a;
                               if (WindowOpen()) {
                                 a.read = true;
                               } else {
                                 read_paused_ = true;
                               }
                               return a;
                             }));
                             Admit(item, std::move(ticket));
                           });
  }

  void OnWriteDone(bool ok) override {
    std::deque<Pending> done;  // freed after mu_
    const Actions actions = Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      Actions a;
      outstanding_bytes_ -= writes_.front().bytes;
      done.push_back(std::move(writes_.front()));
      writes_.pop_front();
      --outstanding_;
      if (!ok || broken_) {  // the client is gone, or the stream was ended
        broken_ = true;
        outstanding_ -= static_cast<int>(writes_.size());
        for (Pending& pending : writes_) {
          outstanding_bytes_ -= pending.bytes;
          done.push_back(std::move(pending));
        }
        writes_.clear();
      }
      if (!writes_.empty()) {
        a.write = &writes_.front().message;
        a.more = writes_.size() > 1;
        write_started_ = absl::Now();
      } else {
        writing_ = false;
      }
      if (read_paused_ && !broken_ && WindowOpen()) {
        read_paused_ = false;
        a.read = true;
      }
      return a;
    });
    Act(actions);
  }

  void OnCancel() override {
    Act(Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      broken_ = true;
      return Actions{};
    }));
  }

  void OnDone() override {
    service_->UnwatchStream(this);
    // A stream ended for not reading was cancelled, but its client was told
    // RESOURCE_EXHAUSTED.
    const absl::StatusCode code = final_code_ == absl::StatusCode::kResourceExhausted
                                      ? final_code_
                                      : CodeSeenByClient(absl::Status(final_code_, ""), context_,
                                                         absl::FromChrono(context_->deadline()));
    service_->metrics_->RequestFinished("Batch", code,
                                        absl::ToDoubleSeconds(absl::Now() - accepted_));
    service_->EndCall();
    delete this;
  }

  // Called by the watch, with the service's streams_mu_ held. When the write
  // in flight started stalled_stream_timeout or more before `now`, marks the
  // stream ended and pinned (it cannot finish, so it lives until Cut) and
  // returns true; the caller must then call Cut().
  bool PinIfStalled(absl::Time now) {
    absl::MutexLock lock(&mu_);
    const absl::Duration timeout = service_->options_.stalled_stream_timeout;
    if (!writing_ || broken_ || now - write_started_ < timeout) return false;
    broken_ = true;
    stalled_ = true;
    ++pins_;
    int64_t unsent_bytes = 0;
    for (const Pending& pending : writes_) unsent_bytes += pending.bytes;
    cut_message_ = absl::StrCat(
        "the client did not read its answers: one waited ", absl::FormatDuration(timeout),
        " to be written (--stalled_stream_timeout), so the stream was ended and its ",
        writes_.size(), " unsent answers (", unsent_bytes, " bytes) dropped");
    return true;
  }

  // Ends a stream that PinIfStalled pinned. Finish would wait behind the
  // write in flight, which waits for the client: cancelling sends the status
  // (as trailers) at once and fails the write and read in flight, whose
  // completions drop the answers. REQUIRES: neither mu_ nor the service's
  // streams_mu_ held.
  void Cut() {
    grpc_call_cancel_with_status(context_->c_call(), GRPC_STATUS_RESOURCE_EXHAUSTED,
                                 cut_message_.c_str(), nullptr);
    Act(Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      --pins_;
      return Actions{};
    }));
  }

 private:
  // gRPC operations to start once mu_ is released.
  struct Actions {
    bool read = false;
    grpc::ByteBuffer* write = nullptr;
    // More answers are queued behind `write`: gRPC may hold it back to send
    // with them (the last of a run is written without the hint, and flushes).
    bool more = false;
    bool finish = false;
  };

  template <typename Fn>
  Actions Locked(Fn fn) {
    absl::MutexLock lock(&mu_);
    Actions actions = fn();
    // Every item is answered (or dropped), nothing is being written and the
    // watch holds no pin: the stream can finish once the client has
    // half-closed (or is gone).
    if (!finishing_ && !writing_ && outstanding_ == 0 && pins_ == 0 && (reads_done_ || broken_)) {
      finishing_ = true;
      final_code_ = stalled_  ? absl::StatusCode::kResourceExhausted
                    : broken_ ? absl::StatusCode::kCancelled
                              : absl::StatusCode::kOk;
      actions.finish = true;
      actions.read = false;
    }
    return actions;
  }

  // REQUIRES: mu_ not held. Finish comes last: `this` may be deleted after.
  void Act(const Actions& actions) {
    if (actions.read) StartRead(&request_);
    if (actions.write != nullptr) {
      StartWrite(actions.write,
                 actions.more ? grpc::WriteOptions().set_buffer_hint() : grpc::WriteOptions());
    }
    if (actions.finish) {
      switch (final_code_) {
        case absl::StatusCode::kOk:
          Finish(grpc::Status::OK);
          break;
        case absl::StatusCode::kResourceExhausted:  // the client already has it (Cut)
          Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, cut_message_));
          break;
        default:
          Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the batch stream was cancelled"));
          break;
      }
    }
  }

  // True while another item may be read ahead of the answers.
  bool WindowOpen() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return outstanding_ < service_->options_.batch_window &&
           outstanding_bytes_ < service_->options_.batch_window_bytes;
  }

  // One item read: its admission, the call it belongs to, its raw bytes.
  struct Item {
    Holding holding;
    Call call;
  };

  // The item's admission came (or was refused): runs it on a worker, or
  // answers the refusal.
  void Admit(const std::shared_ptr<Item>& item, absl::StatusOr<Admission::Ticket> ticket) {
    if (!ticket.ok()) {
      Answer(item, ticket.status(), nullptr, "Batch/Admission");
      return;
    }
    item->holding.ticket = *std::move(ticket);
    service_->pool_->Schedule([this, item] { RunItem(item); });
  }

  // Decodes and runs the item, on a worker thread; or, when it needs more
  // admission than it holds, waits for that (holding receive_slot_ for its
  // bytes) and runs it again.
  void RunItem(const std::shared_ptr<Item>& item) {
    auto request = std::make_unique<v1::BatchRequest>();
    auto response = std::make_unique<v1::BatchResponse>();
    absl::string_view method = "Batch/Invalid";
    absl::Status status;
    const absl::Time decode_start = absl::Now();
    HostArena* const arena = service_->options_.request_arena;
    StagedTensors staged;
    absl::Status decoded = Decode(item->holding.raw, request.get(), arena, &staged);
    item->holding.decode_seconds += absl::ToDoubleSeconds(absl::Now() - decode_start);
    if (arena != nullptr)
      service_->metrics_->AddStagedBytes(staged.arena_bytes, staged.missed_bytes);
    if (!decoded.ok()) {
      service_->Admitted(0, &item->holding);
      status = decoded;
    } else {
      item->holding.staged = &staged;
      status =
          service_->ExecuteBatchItem(*request, item->call, response.get(), &item->holding, &method);
      item->holding.staged = nullptr;
    }
    staged.blocks.clear();  // the item's operation is done with them
    if (item->holding.request_bytes >= kRecycleMessageBytes) RecycleTensorBytes(request.get());
    request.reset();  // its bytes go before the answer's are encoded
    if (status.ok() && item->holding.more_bytes > 0) {
      const int64_t more = std::exchange(item->holding.more_bytes, 0);
      item->holding.ticket = Admission::Ticket();
      auto admit_more = [this, item, more] {
        service_->WhenAdmitted(*service_->admission_, more, item->call,
                               [this, item](absl::StatusOr<Admission::Ticket> ticket) {
                                 Admit(item, std::move(ticket));
                               });
      };
      if (item->holding.slot.bytes() > 0) {
        admit_more();
        return;
      }
      service_->WhenAdmitted(service_->receive_slot_, 1, item->call,
                             [this, item, admit_more](absl::StatusOr<Admission::Ticket> slot) {
                               if (!slot.ok()) {
                                 Answer(item, slot.status(), nullptr, "Batch/Admission");
                                 return;
                               }
                               item->holding.slot = *std::move(slot);
                               admit_more();
                             });
      return;
    }
    Answer(item, status, std::move(response), method);
  }

  // Encodes the item's answer (its result, or `status` when that failed)
  // and queues it to be written; the item's admission shrinks to the
  // encoded answer's bytes, held until it is written.
  void Answer(const std::shared_ptr<Item>& item, const absl::Status& status,
              std::unique_ptr<v1::BatchResponse> response, absl::string_view method) {
    // Once the answer is published below, another thread may write it,
    // finish the stream and delete this reactor: after that point only
    // locals are touched (and `this` only by the thread handed a write or
    // the finish).
    ComputeService* const service = service_;
    Holding& holding = item->holding;
    if (holding.queued) service->LeaveQueue();
    holding.queued = false;
    holding.slot = Admission::Ticket();
    if (response == nullptr) {
      // Refused before it was decoded: its id, read without its tensors.
      response = std::make_unique<v1::BatchResponse>();
      v1::BatchRequest request;
      std::vector<wire::ExternalField> external;
      if (wire::Parse(holding.raw, &request, &external).ok()) {
        response->set_id(request.id().substr(0, kMaxBatchIdBytes));
      }
    }
    holding.raw.Clear();
    if (!status.ok()) {
      response->clear_result();
      const grpc::Status grpc_status = ToGrpcStatus(status);
      response->set_code(static_cast<int32_t>(grpc_status.error_code()));
      response->set_message(grpc_status.error_message());
    }
    Pending pending;
    if (absl::StatusOr<grpc::ByteBuffer> encoded = EncodeAnswer(response.get()); encoded.ok()) {
      pending.message = *std::move(encoded);
    } else {
      // Only an answer over 2 GiB could fail: answer without it.
      v1::BatchResponse failed;
      failed.set_id(response->id());
      failed.set_code(static_cast<int32_t>(grpc::StatusCode::INTERNAL));
      failed.set_message(std::string(encoded.status().message()));
      pending.message = wire::Serialize(failed);
    }
    response.reset();
    pending.bytes = static_cast<int64_t>(pending.message.Length());
    holding.ticket.ShrinkTo(pending.bytes);
    pending.ticket = std::move(holding.ticket);
    service->metrics_->AddSentBytes(pending.bytes);
    service->metrics_->ItemFinished(method, status.code(),
                                    absl::ToDoubleSeconds(absl::Now() - item->call.accepted));
    std::optional<Pending> dropped;  // given back after mu_
    const Actions actions = Locked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      Actions a;
      if (broken_) {
        --outstanding_;
        outstanding_bytes_ -= holding.request_bytes;
        dropped = std::move(pending);
        return a;
      }
      outstanding_bytes_ += pending.bytes - holding.request_bytes;
      writes_.push_back(std::move(pending));
      if (!writing_) {
        writing_ = true;
        write_started_ = absl::Now();
        a.write = &writes_.front().message;
      }
      return a;
    });
    dropped.reset();
    // Counted as running until here, so a drain waits for the answer to be
    // queued; the write itself is awaited with the stream (BeginCall).
    service->EndOp();
    Act(actions);
  }

  ComputeService* const service_;
  grpc::CallbackServerContext* const context_;
  const absl::Time accepted_;
  grpc::ByteBuffer request_;                             // the read in flight (one at a time)
  absl::StatusCode final_code_ = absl::StatusCode::kOk;  // set before Finish
  std::string cut_message_;  // why the watch ended the stream; set before Cut

  absl::Mutex mu_;
  // Items read and not yet answered (running, or queued for writing).
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  // Their bytes: a running item's request, a queued item's answer.
  int64_t outstanding_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Answers waiting to be written; the front one is being written when
  // writing_, since write_started_.
  struct Pending {
    grpc::ByteBuffer message;  // the encoded answer
    int64_t bytes = 0;         // its share of the window
    Admission::Ticket ticket;  // its admission, until it is written
  };
  std::deque<Pending> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time write_started_ ABSL_GUARDED_BY(mu_);
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  // The client is gone (cancelled, or a write failed) or the stream was
  // ended by the watch (stalled_): answers are dropped.
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;
  // Held by the watch between deciding to end the stream and doing so.
  int pins_ ABSL_GUARDED_BY(mu_) = 0;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
};

// A Batch stream refused at once (the server is draining).
class ComputeService::RejectedStream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RejectedStream(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

void ComputeService::WatchStream(BatchReactor* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.insert(stream);
}

void ComputeService::UnwatchStream(BatchReactor* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

void ComputeService::Watch() {
  // Admission waits end within kExpirePeriod of their deadline or
  // cancellation; a stream is ended between the timeout and the timeout
  // plus a period after its write started.
  constexpr absl::Duration kExpirePeriod = absl::Milliseconds(5);
  const bool watch_streams = options_.stalled_stream_timeout != absl::InfiniteDuration();
  const absl::Duration period = watch_streams ? std::clamp(options_.stalled_stream_timeout / 10,
                                                           absl::Milliseconds(10), absl::Seconds(1))
                                              : absl::InfiniteDuration();
  absl::Time next_stream_check = absl::Now() + period;
  while (true) {
    std::vector<BatchReactor*> stalled;  // pinned: alive until cut
    {
      absl::MutexLock lock(&streams_mu_);
      if (streams_mu_.AwaitWithTimeout(absl::Condition(&stop_watch_), kExpirePeriod)) return;
      const absl::Time now = absl::Now();
      if (now >= next_stream_check) {
        next_stream_check = now + period;
        for (BatchReactor* stream : streams_) {
          if (stream->PinIfStalled(now)) stalled.push_back(stream);
        }
      }
    }
    // Without streams_mu_: what the cut or an expired wait sets off may end
    // a stream (OnDone).
    for (BatchReactor* stream : stalled) stream->Cut();
    admission_->Expire();
    receive_slot_.Expire();
  }
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ComputeService::OpenBatch(
    grpc::CallbackServerContext* context) {
  if (absl::Status status = CheckAccepting("Batch"); !status.ok()) {
    return new RejectedStream(status);
  }
  return new BatchReactor(this, context);
}

}  // namespace gpucompute
