// A fixed pool of worker threads for data-parallel loops. Several callers may
// run loops on one pool at once; each caller works on its own loop too, so a
// loop always finishes even when every worker is busy elsewhere (and loops may
// nest).
#ifndef GPUCOMPUTE_SERVER_DEVICE_THREAD_POOL_H_
#define GPUCOMPUTE_SERVER_DEVICE_THREAD_POOL_H_

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
  explicit ThreadPool(int threads);
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
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_DEVICE_THREAD_POOL_H_
