// The Batch RPC: one bidirectional stream of operations, each answered with
// its own code as it finishes (ComputeService::Batch).
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/service/compute_service.h"
#include "server/service/convert.h"

namespace gpucompute {

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
    service_->BeginCall();
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
    const Call call{context_, absl::Now(), absl::FromChrono(context_->deadline()),
                    OwnerOf(*context_)};
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
        a.more = writes_.size() > 1;
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
    service_->metrics_->RequestFinished("Batch", code,
                                        absl::ToDoubleSeconds(absl::Now() - accepted_));
    service_->EndCall();
    delete this;
  }

 private:
  // gRPC operations to start once mu_ is released.
  struct Actions {
    bool read = false;
    v1::BatchResponse* write = nullptr;
    // More answers are queued behind `write`: gRPC may hold it back to send
    // with them (the last of a run is written without the hint, and flushes).
    bool more = false;
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
    if (actions.write != nullptr) {
      StartWrite(actions.write,
                 actions.more ? grpc::WriteOptions().set_buffer_hint() : grpc::WriteOptions());
    }
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
    absl::string_view method;
    const absl::Status status =
        service_->ExecuteBatchItem(item, call, response.get(), &ticket, &method);
    if (!status.ok()) {
      response->clear_result();
      const grpc::Status grpc_status = ToGrpcStatus(status);
      response->set_code(static_cast<int32_t>(grpc_status.error_code()));
      response->set_message(grpc_status.error_message());
    }
    service->metrics_->AddSentBytes(static_cast<int64_t>(response->ByteSizeLong()));
    service->metrics_->ItemFinished(method, status.code(),
                                    absl::ToDoubleSeconds(absl::Now() - call.accepted));
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
    // queued; the write itself is awaited with the stream (BeginCall).
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
