// The service's worker threads: compute runs here, off gRPC's threads.
#ifndef GPUCOMPUTE_SERVER_SERVICE_WORKER_POOL_H_
#define GPUCOMPUTE_SERVER_SERVICE_WORKER_POOL_H_

#include <cstddef>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute {

// A fixed set of threads running tasks in FIFO order.
class WorkerPool {
 public:
  // Starts `num_threads` threads. REQUIRES: num_threads >= 1.
  explicit WorkerPool(int num_threads);
  // Runs every task already scheduled, then joins the threads.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task`. After Stop() has begun, tasks still run (Stop waits for
  // them), so a caller never loses one.
  void Schedule(absl::AnyInvocable<void()> task);

  // Waits until every scheduled task (including tasks those schedule) has
  // run, then joins the threads. Idempotent.
  void Stop();

  // Tasks queued and not yet started.
  size_t queued() const;
  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();

  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_WORKER_POOL_H_
