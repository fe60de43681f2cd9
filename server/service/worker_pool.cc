#include "server/service/worker_pool.h"

#include <utility>

namespace gpucompute {

WorkerPool::WorkerPool(int num_threads) {
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() { Stop(); }

void WorkerPool::Schedule(absl::AnyInvocable<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void WorkerPool::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

size_t WorkerPool::queued() const {
  absl::MutexLock lock(&mu_);
  return tasks_.size();
}

void WorkerPool::Loop() {
  for (;;) {
    absl::AnyInvocable<void()> task;
    {
      absl::MutexLock lock(&mu_);
      // A thread leaves only when nothing is queued and nothing runs that
      // could still schedule more.
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !tasks_.empty() || (stopping_ && running_ == 0);
      };
      mu_.Await(absl::Condition(&wake));
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
    }
    task();
    task = nullptr;
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace gpucompute
