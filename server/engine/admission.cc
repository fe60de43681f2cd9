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

void Admission::Ticket::ShrinkTo(int64_t bytes) {
  if (owner_ == nullptr || bytes >= bytes_) return;
  const int64_t given_back = bytes_ - std::max<int64_t>(bytes, 0);
  bytes_ -= given_back;
  owner_->Return(given_back);
}

Admission::Admission(int64_t max_inflight_bytes, std::string limit_name,
                     std::function<void(int64_t)> observe)
    : limit_(max_inflight_bytes),
      limit_name_(std::move(limit_name)),
      observe_(std::move(observe)) {}

bool Admission::Fits(int64_t bytes) const { return limit_ <= 0 || inflight_ + bytes <= limit_; }

absl::Status Admission::TooLarge(int64_t bytes) const {
  return absl::ResourceExhaustedError(absl::StrCat("the request holds ", bytes,
                                                   " bytes while it runs, more than the "
                                                   "in-flight limit of ",
                                                   limit_, " bytes (", limit_name_, ")"));
}

absl::Status Admission::TimedOut(absl::Time start, absl::Time now, int64_t bytes) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "deadline passed after ", absl::FormatDuration(now - start),
      " waiting for room under the in-flight limit of ", limit_, " bytes (", limit_name_,
      "); this request holds ", bytes, " bytes and ", inflight_, " are in flight"));
}

void Admission::Take(int64_t bytes) {
  inflight_ += bytes;
  if (observe_ && bytes != 0) observe_(bytes);
}

void Admission::Dispatch(std::vector<Decided>* decided) {
  while (!line_.empty()) {
    auto it = async_.find(line_.front());
    if (it == async_.end() || !Fits(it->second.bytes)) return;  // a blocked Admit, or no room
    AsyncWaiter waiter = std::move(it->second);
    async_.erase(it);
    line_.pop_front();
    Take(waiter.bytes);
    decided->push_back(
        {std::move(waiter.done),
         Ticket(this, waiter.bytes, absl::ToDoubleSeconds(absl::Now() - waiter.start))});
  }
}

void Admission::Tell(std::vector<Decided>& decided) {
  for (Decided& d : decided) d.done(std::move(d.result));
}

absl::StatusOr<Admission::Ticket> Admission::Admit(int64_t bytes, absl::Time deadline,
                                                   absl::FunctionRef<bool()> cancelled) {
  if (limit_ > 0 && bytes > limit_) return TooLarge(bytes);
  const absl::Time start = absl::Now();
  std::vector<Decided> decided;  // waiters behind this one that its leaving let in
  absl::StatusOr<Ticket> result = absl::UnknownError("not admitted");
  {
    absl::MutexLock lock(&mu_);
    const uint64_t seq = next_seq_++;
    line_.push_back(seq);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return line_.front() == seq && Fits(bytes);
    };
    while (!ready()) {
      const absl::Time now = absl::Now();
      if (cancelled()) {
        result = absl::CancelledError(
            absl::StrCat("cancelled while waiting for admission (", limit_name_, ")"));
      } else if (now >= deadline) {
        result = TimedOut(start, now, bytes);
      } else {
        mu_.AwaitWithDeadline(absl::Condition(&ready), std::min(deadline, now + kPollInterval));
        continue;
      }
      line_.erase(std::find(line_.begin(), line_.end(), seq));
      break;
    }
    if (!line_.empty() && line_.front() == seq) {
      line_.pop_front();
      Take(bytes);
      result = Ticket(this, bytes, absl::ToDoubleSeconds(absl::Now() - start));
    }
    Dispatch(&decided);
  }
  Tell(decided);
  return result;
}

std::optional<Admission::Ticket> Admission::TryAdmit(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (!line_.empty() || !Fits(bytes)) return std::nullopt;
  Take(bytes);
  return Ticket(this, bytes, 0);
}

void Admission::AdmitAsync(int64_t bytes, absl::Time deadline, std::function<bool()> cancelled,
                           Done done) {
  if (limit_ > 0 && bytes > limit_) {
    done(TooLarge(bytes));
    return;
  }
  if (std::optional<Ticket> ticket = TryAdmit(bytes)) {
    done(*std::move(ticket));
    return;
  }
  std::vector<Decided> decided;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t seq = next_seq_++;
    line_.push_back(seq);
    async_.emplace(
        seq, AsyncWaiter{bytes, absl::Now(), deadline, std::move(cancelled), std::move(done)});
    // Room may have been made since TryAdmit, with no waiter to take it.
    Dispatch(&decided);
  }
  Tell(decided);
}

void Admission::Expire() {
  std::vector<Decided> decided;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto it = async_.begin(); it != async_.end();) {
      AsyncWaiter& waiter = it->second;
      absl::Status ended;
      if (waiter.cancelled && waiter.cancelled()) {
        ended = absl::CancelledError(
            absl::StrCat("cancelled while waiting for admission (", limit_name_, ")"));
      } else if (now >= waiter.deadline) {
        ended = TimedOut(waiter.start, now, waiter.bytes);
      } else {
        ++it;
        continue;
      }
      line_.erase(std::find(line_.begin(), line_.end(), it->first));
      decided.push_back({std::move(waiter.done), std::move(ended)});
      it = async_.erase(it);
    }
    if (!decided.empty()) Dispatch(&decided);
  }
  Tell(decided);
}

void Admission::Return(int64_t bytes) {
  std::vector<Decided> decided;
  {
    absl::MutexLock lock(&mu_);
    inflight_ -= bytes;
    if (observe_ && bytes != 0) observe_(-bytes);
    Dispatch(&decided);
  }
  Tell(decided);
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
