// Admission control on bytes in flight: the server's bound on the bytes of
// requests served at once (--max_inflight_bytes) and each device's bound on
// the bytes of the shards it holds (--device_max_inflight_bytes). Bounded
// memory under load; first come, first served.
#ifndef GPUCOMPUTE_SERVER_ENGINE_ADMISSION_H_
#define GPUCOMPUTE_SERVER_ENGINE_ADMISSION_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
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
  explicit Admission(int64_t max_inflight_bytes, std::string limit_name = "--max_inflight_bytes");
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

  int64_t limit() const { return limit_; }
  // Bytes held by live tickets.
  int64_t inflight_bytes() const;
  // Requests waiting in Admit().
  int waiting() const;

 private:
  bool Fits(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Return(int64_t bytes);

  const int64_t limit_;
  const std::string limit_name_;
  mutable absl::Mutex mu_;
  int64_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> line_ ABSL_GUARDED_BY(mu_);  // waiters, oldest first
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_ENGINE_ADMISSION_H_
