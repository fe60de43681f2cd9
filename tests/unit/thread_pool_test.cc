#include "server/device/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

namespace gpucompute {
namespace {

class ThreadPoolTest : public ::testing::TestWithParam<int> {};  // spin_us

// Loops run back to back (as a staging copy's chunks are): every index of
// every loop runs once, with and without the workers' spin.
TEST_P(ThreadPoolTest, EveryIndexRunsOnceInLoopsBackToBack) {
  ThreadPool pool(4, GetParam());
  for (int loop = 0; loop < 500; ++loop) {
    const int n = 1 + loop % 37;
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
    for (int i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "loop " << loop << " index " << i;
  }
}

// ParallelRange's pieces cover the range once, in at most `pieces` parts of
// at least min_size (but the last).
TEST_P(ThreadPoolTest, RangesCoverTheRangeOnce) {
  ThreadPool pool(3, GetParam());
  for (int64_t total : {1, 5, 100, 1000, 4097}) {
    for (int64_t min_size : {1, 64, 1000}) {
      std::vector<std::atomic<int>> hits(total);
      std::atomic<int> parts{0};
      pool.ParallelRange(0, total, min_size, 3, [&](int64_t b, int64_t e) {
        parts.fetch_add(1);
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < total; ++i) ASSERT_EQ(hits[i].load(), 1) << total << " " << i;
      EXPECT_LE(parts.load(), 3);
      EXPECT_LE(parts.load(), (total + min_size - 1) / min_size);
    }
  }
}

// Several callers at once, each on its own loops: all finish, each with its
// own indices, and a worker never runs one caller's index twice.
TEST_P(ThreadPoolTest, ConcurrentCallersEachFinishTheirLoops) {
  ThreadPool pool(4, GetParam());
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 6; ++c) {
    callers.emplace_back([&] {
      for (int loop = 0; loop < 200; ++loop) {
        std::atomic<int64_t> sum{0};
        pool.ParallelFor(16, [&](int64_t i) { sum.fetch_add(i + 1); });
        ASSERT_EQ(sum.load(), 16 * 17 / 2);
        total.fetch_add(1);
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 6 * 200);
}

TEST_P(ThreadPoolTest, AnExceptionReachesTheCaller) {
  ThreadPool pool(4, GetParam());
  EXPECT_THROW(pool.ParallelFor(50,
                                [](int64_t i) {
                                  if (i == 17) throw std::runtime_error("17");
                                }),
               std::runtime_error);
  // The pool still runs loops afterwards.
  std::atomic<int> ran{0};
  pool.ParallelFor(10, [&](int64_t) { ran.fetch_add(1); });
  EXPECT_EQ(ran.load(), 10);
}

INSTANTIATE_TEST_SUITE_P(Spin, ThreadPoolTest, ::testing::Values(0, 50),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "spin_us_" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace gpucompute
