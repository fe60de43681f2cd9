#include "server/engine/admission.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpucompute {
namespace {

// How often a waiter checks for cancellation.
constexpr absl::Duration kPollInterval = absl::Milliseconds(20);

}  // namespace

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    wait_seconds_ = other.wait_seconds_;
  }
  return *this;
}

void Admission::Ticket::Release() {
  if (owner_ != nullptr) owner_->Return(bytes_);
  owner_ = nullptr;
  bytes_ = 0;
}

Admission::Admission(int64_t max_inflight_bytes, std::string limit_name)
    : limit_(max_inflight_bytes), limit_name_(std::move(limit_name)) {}

bool Admission::Fits(int64_t bytes) const { return limit_ <= 0 || inflight_ + bytes <= limit_; }

absl::StatusOr<Admission::Ticket> Admission::Admit(int64_t bytes, absl::Time deadline,
                                                   absl::FunctionRef<bool()> cancelled) {
  if (limit_ > 0 && bytes > limit_) {
    return absl::ResourceExhaustedError(absl::StrCat("the request holds ", bytes,
                                                     " bytes while it runs, more than the "
                                                     "in-flight limit of ",
                                                     limit_, " bytes (", limit_name_, ")"));
  }
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  const uint64_t seq = next_seq_++;
  line_.push_back(seq);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return line_.front() == seq && Fits(bytes);
  };
  auto leave_line = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    line_.erase(std::find(line_.begin(), line_.end(), seq));
  };
  while (!ready()) {
    if (cancelled()) {
      leave_line();
      return absl::CancelledError(
          absl::StrCat("cancelled while waiting for admission (", limit_name_, ")"));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      leave_line();
      return absl::ResourceExhaustedError(absl::StrCat(
          "deadline passed after ", absl::FormatDuration(now - start),
          " waiting for room under the in-flight limit of ", limit_, " bytes (", limit_name_,
          "); this request holds ", bytes, " bytes and ", inflight_, " are in flight"));
    }
    mu_.AwaitWithDeadline(absl::Condition(&ready), std::min(deadline, now + kPollInterval));
  }
  line_.pop_front();
  inflight_ += bytes;
  return Ticket(this, bytes, absl::ToDoubleSeconds(absl::Now() - start));
}

void Admission::Return(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  inflight_ -= bytes;
}

int64_t Admission::inflight_bytes() const {
  absl::MutexLock lock(&mu_);
  return inflight_;
}

int Admission::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(line_.size());
}

}  // namespace gpucompute
