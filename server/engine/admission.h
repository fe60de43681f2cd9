// Admission control on bytes in flight: the server's bound on the bytes of
// requests served at once (--max_inflight_bytes) and each device's bound on
// the bytes of the shards it holds (--device_max_inflight_bytes). Bounded
// memory under load; first come, first served. Waiters block (Admit) or are
// called back (AdmitAsync); both wait in the same line.
#ifndef GPUCOMPUTE_SERVER_ENGINE_ADMISSION_H_
#define GPUCOMPUTE_SERVER_ENGINE_ADMISSION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpucompute {

class Admission {
 public:
  // Holds `bytes` of the budget while it lives; returns them when destroyed.
  // Move-only. A default-constructed ticket holds nothing.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }

    int64_t bytes() const { return bytes_; }
    // Seconds Admit() waited for room.
    double wait_seconds() const { return wait_seconds_; }
    // Gives back what the ticket holds beyond `bytes` (nothing when it holds
    // no more than that), letting waiters in.
    void ShrinkTo(int64_t bytes);

   private:
    friend class Admission;
    Ticket(Admission* owner, int64_t bytes, double wait_seconds)
        : owner_(owner), bytes_(bytes), wait_seconds_(wait_seconds) {}
    void Release();

    Admission* owner_ = nullptr;
    int64_t bytes_ = 0;
    double wait_seconds_ = 0;
  };

  // `max_inflight_bytes` <= 0 admits everything at once. `limit_name` says in
  // error messages which limit refused (e.g. "--max_inflight_bytes").
  // `observe`, when given, is called with every change of the bytes held
  // (+ when admitted, - when given back), under the admission's lock.
  explicit Admission(int64_t max_inflight_bytes, std::string limit_name = "--max_inflight_bytes",
                     std::function<void(int64_t)> observe = nullptr);
  // REQUIRES: no ticket outlives the Admission.
  ~Admission() = default;
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Admits a request that holds `bytes` while it runs. Requests are admitted
  // in arrival order: each waits until it is first in line and fits beside
  // those in flight. Errors (each naming the limit): RESOURCE_EXHAUSTED at
  // once when `bytes` alone exceeds the limit, RESOURCE_EXHAUSTED when
  // `deadline` passes first, CANCELLED when `cancelled()` turns true while
  // waiting (polled every few milliseconds).
  absl::StatusOr<Ticket> Admit(int64_t bytes, absl::Time deadline,
                               absl::FunctionRef<bool()> cancelled);

  // Admits `bytes` at once when nobody is waiting and they fit; otherwise
  // returns nullopt and changes nothing.
  std::optional<Ticket> TryAdmit(int64_t bytes);

  // Admit without blocking: `done` is called exactly once, with the ticket
  // or with the error Admit would return, in the same line as Admit's
  // waiters. It runs before AdmitAsync returns when the request is admitted
  // or refused at once; otherwise later, on the thread that made room (a
  // ticket released or shrunk) or that called Expire. `done` must not block.
  // The deadline and `cancelled` (thread-safe) are looked at only by Expire.
  using Done = absl::AnyInvocable<void(absl::StatusOr<Ticket>)>;
  void AdmitAsync(int64_t bytes, absl::Time deadline, std::function<bool()> cancelled, Done done);

  // Ends the waits of AdmitAsync whose deadline has passed
  // (RESOURCE_EXHAUSTED) or that were cancelled (CANCELLED). Whoever uses
  // AdmitAsync calls this every few milliseconds.
  void Expire();

  int64_t limit() const { return limit_; }
  // Bytes held by live tickets.
  int64_t inflight_bytes() const;
  // Requests waiting in Admit().
  int waiting() const;

 private:
  // An AdmitAsync waiting in line.
  struct AsyncWaiter {
    int64_t bytes = 0;
    absl::Time start;
    absl::Time deadline;
    std::function<bool()> cancelled;
    Done done;
  };
  // What a change of the line decided, to be told once mu_ is released.
  struct Decided {
    Done done;
    absl::StatusOr<Ticket> result;
  };

  bool Fits(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TooLarge(int64_t bytes) const;
  absl::Status TimedOut(absl::Time start, absl::Time now, int64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Take(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Return(int64_t bytes);
  // Admits the asynchronous waiters at the front of the line that fit.
  void Dispatch(std::vector<Decided>* decided) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Tell(std::vector<Decided>& decided);

  const int64_t limit_;
  const std::string limit_name_;
  const std::function<void(int64_t)> observe_;
  mutable absl::Mutex mu_;
  int64_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> line_ ABSL_GUARDED_BY(mu_);  // waiters, oldest first
  std::map<uint64_t, AsyncWaiter> async_ ABSL_GUARDED_BY(mu_);  // by their place in line_
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_ENGINE_ADMISSION_H_
