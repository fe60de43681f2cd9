// A fixed pool of worker threads for data-parallel loops. Several callers may
// run loops on one pool at once; each caller works on its own loop too, so a
// loop always finishes even when every worker is busy elsewhere (and loops may
// nest).
#ifndef GPUCOMPUTE_SERVER_DEVICE_THREAD_POOL_H_
#define GPUCOMPUTE_SERVER_DEVICE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace gpucompute {

class ThreadPool {
 public:
  // Runs loops on `threads` threads in all: the caller of ParallelFor plus
  // threads - 1 workers. REQUIRES: threads >= 1.
  //
  // With `spin_us` > 0 a worker that finds no loop waits that long awake (a
  // pause loop) before it sleeps, and so does the caller waiting for the
  // last calls of its loop: loops that follow each other closely (the chunks
  // of a staging copy) then skip the wake-ups, tens of microseconds each,
  // at the cost of that much CPU after each loop.
  explicit ThreadPool(int threads, int spin_us = 0);
  // Joins the workers. REQUIRES: no ParallelFor in progress.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads that work on one loop (the caller included).
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) for every i in [0, n), spread over the pool, and returns when
  // all calls have returned. The first exception thrown by fn is rethrown
  // here (the remaining indices are skipped).
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

  // Splits [begin, end) into at most `pieces` contiguous ranges of at least
  // `min_size` elements (the last may be shorter when the range is) and calls
  // fn(piece_begin, piece_end) for each, in parallel.
  void ParallelRange(int64_t begin, int64_t end, int64_t min_size, int64_t pieces,
                     const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Job;

  void WorkerLoop();
  // Claims and runs indices of `job` until none are left.
  static void Drain(Job& job);

  // std::mutex rather than absl::Mutex: ThreadSanitizer sees through it
  // (the system's abseil is not instrumented).
  std::mutex mu_;
  std::condition_variable work_available_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  // queue_.size(), readable without mu_ (the workers' spin).
  std::atomic<int64_t> queued_{0};
  const int spin_us_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_DEVICE_THREAD_POOL_H_
