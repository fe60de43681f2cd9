#include "server/device/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace gpucompute {

struct ThreadPool::Job {
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t n = 0;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable finished;
  std::atomic<int64_t> done_count{0};  // done, readable without mu (the owner's spin)
  int64_t done ABSL_GUARDED_BY(mu) = 0;
  std::exception_ptr error ABSL_GUARDED_BY(mu);
};

namespace {

void Pause() {
#if defined(__SSE2__)
  _mm_pause();
#endif
}

// Spins up to `us` microseconds until `ready()`; returns whether it is.
template <typename Ready>
bool SpinUntil(int us, const Ready& ready) {
  if (us <= 0) return ready();
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      Pause();
    }
    if (std::chrono::steady_clock::now() >= until) return ready();
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads, int spin_us) : spin_us_(spin_us) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_available_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Drain(Job& job) {
  int64_t ran = 0;
  std::exception_ptr error;
  for (;;) {
    const int64_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.n) break;
    if (!job.failed.load(std::memory_order_relaxed)) {
      try {
        (*job.fn)(i);
      } catch (...) {
        if (!error) error = std::current_exception();
        job.failed.store(true, std::memory_order_relaxed);
      }
    }
    ++ran;
  }
  if (ran == 0) return;
  std::lock_guard<std::mutex> lock(job.mu);
  job.done += ran;
  job.done_count.store(job.done, std::memory_order_release);
  if (error && !job.error) job.error = error;
  if (job.done == job.n) job.finished.notify_all();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    SpinUntil(spin_us_, [this] { return queued_.load(std::memory_order_acquire) > 0; });
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_available_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      job = queue_.front();
      // A job whose indices are all claimed leaves the queue; its owner waits
      // for the calls still running.
      if (job->next.load(std::memory_order_relaxed) >= job->n) {
        queue_.pop_front();
        queued_.store(int64_t(queue_.size()), std::memory_order_release);
        continue;
      }
    }
    Drain(*job);
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(job);
    queued_.store(int64_t(queue_.size()), std::memory_order_release);
  }
  // Wake as many workers as can help (the caller takes a share too).
  if (n - 1 >= static_cast<int64_t>(workers_.size())) {
    work_available_.notify_all();
  } else {
    for (int64_t i = 0; i < n - 1; ++i) work_available_.notify_one();
  }
  Drain(*job);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) queue_.erase(it);
    queued_.store(int64_t(queue_.size()), std::memory_order_release);
  }
  SpinUntil(spin_us_, [&] { return job->done_count.load(std::memory_order_acquire) == job->n; });
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(job->mu);
    job->finished.wait(lock, [&] { return job->done == job->n; });
    error = job->error;
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::ParallelRange(int64_t begin, int64_t end, int64_t min_size, int64_t pieces,
                               const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t total = end - begin;
  if (total <= 0) return;
  min_size = std::max<int64_t>(min_size, 1);
  pieces = std::clamp<int64_t>(std::min(pieces, (total + min_size - 1) / min_size), 1, total);
  const int64_t step = total / pieces, extra = total % pieces;
  ParallelFor(pieces, [&](int64_t p) {
    const int64_t b = begin + p * step + std::min(p, extra);
    const int64_t e = b + step + (p < extra ? 1 : 0);
    fn(b, e);
  });
}

}  // namespace gpucompute
