// The allocator setting that lets large messages reuse freed memory: checked
// through glibc's own statistics, in a thread of its own as gRPC's would be.
#include "proto/host_memory.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace gpucompute {
namespace {

TEST(HostMemoryTest, RefusesRetainedBytesOutOfRange) {
  EXPECT_TRUE(absl::IsInvalidArgument(KeepFreedHostMemory(-1)));
  EXPECT_TRUE(absl::IsInvalidArgument(KeepFreedHostMemory(int64_t{1} << 31)));
  EXPECT_TRUE(absl::IsInvalidArgument(KeepFreedHostMemory(1 << 20, 0)));
}

TEST(HostMemoryTest, LargeBlocksComeFromTheHeapAndStayForReuse) {
  const absl::Status status = KeepFreedHostMemory(INT32_MAX);
  if (absl::IsInternal(status) && mallopt(M_ARENA_MAX, 1) != 1) {
    GTEST_SKIP() << "this allocator takes no mallopt settings (a sanitizer build)";
  }
  ASSERT_TRUE(status.ok()) << status;
  constexpr size_t kBytes = size_t{64} << 20;  // past glibc's largest mmap threshold
  std::thread worker([kBytes] {
    const struct mallinfo2 before = mallinfo2();
    char* block = static_cast<char*>(malloc(kBytes));
    ASSERT_NE(block, nullptr);
    std::memset(block, 1, kBytes);
    const struct mallinfo2 held = mallinfo2();
    // Not an mmap of its own: the mmapped bytes did not grow.
    EXPECT_LT(held.hblkhd, before.hblkhd + kBytes / 2);
    free(block);
    // Freed into the heap, not unmapped: the free bytes include it.
    EXPECT_GE(mallinfo2().fordblks, kBytes);
  });
  worker.join();
}

// With several arenas, a further arena's heaps stay mapped once made: blocks
// of a few MiB that threads free and allocate again are not page-faulted in
// every time (without the top pad, a third of the bytes were, on the development
// machine). In a child process, since the arena count is the process's.
TEST(HostMemoryTest, FurtherArenasKeepTheirHeaps) {
  if (mallopt(M_ARENA_MAX, 1) != 1) {
    GTEST_SKIP() << "this allocator takes no mallopt settings (a sanitizer build)";
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (!KeepFreedHostMemory(INT32_MAX, 8).ok()) std::_Exit(2);
        constexpr size_t kBlock = size_t{24} << 20;  // three fill most of a 64 MiB heap
        constexpr int kThreads = 4;
        constexpr int kRounds = 20;
        std::atomic<int64_t> faulted_bytes{0};
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
          threads.emplace_back([&faulted_bytes] {
            auto faults = [] {
              struct rusage usage {};
              getrusage(RUSAGE_THREAD, &usage);
              return int64_t{usage.ru_minflt};
            };
            int64_t after_first = 0;
            for (int round = 0; round < kRounds; ++round) {
              if (round == 1) after_first = faults();
              char* blocks[3];
              for (char*& block : blocks) {
                block = static_cast<char*>(malloc(kBlock));
                if (block == nullptr) std::_Exit(3);
                std::memset(block, 1, kBlock);
              }
              for (char* block : blocks) free(block);
            }
            faulted_bytes += (faults() - after_first) * int64_t{sysconf(_SC_PAGESIZE)};
          });
        }
        for (std::thread& thread : threads) thread.join();
        const double touched = double(kThreads) * (kRounds - 1) * 3 * kBlock;
        std::fprintf(stderr, "faulted in %.1f%% of the bytes touched after the first round\n",
                     100.0 * double(faulted_bytes.load()) / touched);
        std::_Exit(double(faulted_bytes.load()) < 0.1 * touched ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(HostMemoryTest, TheTrimmerGivesBackFreedMemoryBeyondTheRetention) {
  // Freed blocks below one still in use: the heap cannot shrink from its
  // top, so they stay resident until trimmed.
  constexpr size_t kBlock = size_t{8} << 20;
  constexpr int kBlocks = 16;            // 128 MiB
  (void)KeepFreedHostMemory(INT32_MAX);  // large blocks from the heap, as in the server
  malloc_trim(0);  // what earlier tests freed is not counted as the trimmers' base
  HostMemoryTrimmer keep_all(int64_t{1} << 30, absl::InfiniteDuration());
  HostMemoryTrimmer keep_none(0, absl::InfiniteDuration());
  std::vector<char*> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    blocks.push_back(static_cast<char*>(malloc(kBlock)));
    ASSERT_NE(blocks.back(), nullptr);
    std::memset(blocks.back(), 1, kBlock);
  }
  char* pin = static_cast<char*>(malloc(4096));  // above them
  std::memset(pin, 1, 4096);
  for (char* block : blocks) free(block);
  if (keep_none.KeptFreeBytes() < int64_t{kBlock} * kBlocks / 2) {
    free(pin);
    GTEST_SKIP() << "the allocator gave the blocks back by itself (mmap)";
  }
  EXPECT_FALSE(keep_all.Trim());  // within 1 GiB
  EXPECT_TRUE(keep_none.Trim());
  EXPECT_LT(keep_none.KeptFreeBytes(), HostMemoryTrimmer::kSlackBytes);
  EXPECT_FALSE(keep_none.Trim());
  free(pin);
}

}  // namespace
}  // namespace gpucompute
