// The allocator setting that lets large messages reuse freed memory: checked
// through glibc's own statistics, in a thread of its own as gRPC's would be.
#include "proto/host_memory.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gpucompute {
namespace {

// The tests of glibc's allocator settings, statistics and trimming are
// skipped where a sanitizer's allocator replaces it.
#define SKIP_WITHOUT_GLIBC_ALLOCATOR() \
  if (!kGlibcMalloc) GTEST_SKIP() << "a sanitizer's allocator replaces glibc's here"

TEST(HostMemoryTest, RefusesRetainedBytesOutOfRange) {
  EXPECT_TRUE(absl::IsInvalidArgument(KeepFreedHostMemory(-1)));
  EXPECT_TRUE(absl::IsInvalidArgument(KeepFreedHostMemory(int64_t{1} << 31)));
  EXPECT_TRUE(absl::IsInvalidArgument(KeepFreedHostMemory(1 << 20, 0)));
}

TEST(HostMemoryTest, LargeBlocksComeFromTheHeapAndStayForReuse) {
  SKIP_WITHOUT_GLIBC_ALLOCATOR();
  const absl::Status status = KeepFreedHostMemory(INT32_MAX);
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
  SKIP_WITHOUT_GLIBC_ALLOCATOR();
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
  SKIP_WITHOUT_GLIBC_ALLOCATOR();
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

// Memory mapped outside the allocator and declared foreign (as pinned
// buffers are) is not taken for freed memory kept: with it the trimmer has
// no more to give back; without the declaration it counts as freed memory.
TEST(HostMemoryTest, TheTrimmerLeavesForeignResidentMemoryAlone) {
  SKIP_WITHOUT_GLIBC_ALLOCATOR();
  constexpr size_t kBytes = size_t{96} << 20;
  malloc_trim(0);
  HostMemoryTrimmer keep_none(0, absl::InfiniteDuration());
  const int64_t before = keep_none.KeptFreeBytes();
  void* mapped = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  std::memset(mapped, 1, kBytes);                                      // resident now
  EXPECT_GE(keep_none.KeptFreeBytes(), before + int64_t{kBytes} / 2);  // as if freed and kept
  AddForeignResidentBytes(int64_t{kBytes});
  EXPECT_LT(keep_none.KeptFreeBytes(), before + int64_t{kBytes} / 4);
  AddForeignResidentBytes(-int64_t{kBytes});
  munmap(mapped, kBytes);
  EXPECT_EQ(ForeignResidentBytes(), 0);
}

constexpr size_t kMiB = size_t{1} << 20;

std::string Buffer(size_t capacity) {
  std::string s;
  s.reserve(capacity);
  return s;
}

TEST(LargeStringCacheTest, TakeServesTheSmallestKeptBufferThatFits) {
  LargeStringCache cache(int64_t{1} << 30);
  std::string small = Buffer(16 * kMiB);
  std::string large = Buffer(32 * kMiB);
  const char* small_data = small.data();
  const char* large_data = large.data();
  cache.Give(std::move(large));
  cache.Give(std::move(small));
  EXPECT_GE(cache.kept_bytes(), int64_t{48} << 20);
  std::string a = cache.Take(12 * kMiB);
  EXPECT_EQ(a.data(), small_data);
  EXPECT_TRUE(a.empty());
  std::string fresh = cache.Take(12 * kMiB);  // the 32 MiB one is more than twice that
  EXPECT_NE(fresh.data(), large_data);
  EXPECT_GE(fresh.capacity(), 12 * kMiB);
  std::string b = cache.Take(20 * kMiB);
  EXPECT_EQ(b.data(), large_data);
  EXPECT_EQ(cache.kept_bytes(), 0);
  std::string c = cache.Take(12 * kMiB);  // none left: a fresh one
  EXPECT_NE(c.data(), small_data);
  EXPECT_NE(c.data(), large_data);
  EXPECT_GE(c.capacity(), 12 * kMiB);
}

TEST(LargeStringCacheTest, KeepsOnlyLargeBuffersWithinItsCapacity) {
  LargeStringCache cache(40 << 20);
  cache.Give(Buffer(LargeStringCache::kMinBytes / 2));  // too small to keep
  EXPECT_EQ(cache.kept_bytes(), 0);
  cache.Give(Buffer(64 * kMiB));  // more than the whole capacity
  EXPECT_EQ(cache.kept_bytes(), 0);
  cache.Give(Buffer(16 * kMiB));
  cache.Give(Buffer(16 * kMiB));
  const int64_t two = cache.kept_bytes();
  EXPECT_GE(two, int64_t{32} << 20);
  EXPECT_LE(two, int64_t{40} << 20);
  cache.Give(Buffer(16 * kMiB));  // one of the kept goes to make room
  EXPECT_EQ(cache.kept_bytes(), two);
  // No kept buffer fits 24 MiB, and with it the cache would be over its
  // capacity: a kept one too small for it goes.
  std::string fresh = cache.Take(24 * kMiB);
  EXPECT_GE(fresh.capacity(), 24 * kMiB);
  EXPECT_LE(cache.kept_bytes(), two / 2);
  EXPECT_GT(cache.kept_bytes(), 0);
  cache.SetCapacity(0);
  EXPECT_EQ(cache.kept_bytes(), 0);
  cache.Give(std::move(fresh));
  EXPECT_EQ(cache.kept_bytes(), 0);
}

TEST(LargeStringCacheTest, SmallTakesAreFreshAndCarryNothingOver) {
  LargeStringCache cache(int64_t{1} << 30);
  std::string kept = Buffer(16 * kMiB);
  kept.assign(16 * kMiB, 'x');
  cache.Give(std::move(kept));
  std::string small = cache.Take(1000);
  EXPECT_TRUE(small.empty());
  EXPECT_GE(small.capacity(), 1000u);
  EXPECT_GE(cache.kept_bytes(), int64_t{16} << 20);  // not served below kMinBytes
  std::string large = cache.Take(10 * kMiB);
  EXPECT_TRUE(large.empty());  // the old bytes are not the new string's
  large.resize(10 * kMiB);
  EXPECT_EQ(large.find('x'), std::string::npos);
}

// The reason for the cache: with several arenas, a buffer larger than a
// further arena's heap is mapped afresh for every request and page-faulted
// in again; one taken from and given back to the cache is not. In a child
// process, since the arena count is the process's.
TEST(LargeStringCacheTest, BuffersLargerThanAnArenaHeapAreNotFaultedInAgain) {
  SKIP_WITHOUT_GLIBC_ALLOCATOR();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (!KeepFreedHostMemory(INT32_MAX, 8).ok()) std::_Exit(2);
        constexpr size_t kBytes = size_t{96} << 20;  // more than a 64 MiB heap
        constexpr int kRounds = 8;
        auto faults = [] {
          struct rusage usage {};
          getrusage(RUSAGE_THREAD, &usage);
          return int64_t{usage.ru_minflt} * int64_t{sysconf(_SC_PAGESIZE)};
        };
        int64_t cached = 0;
        int64_t plain = 0;
        std::thread worker([&] {
          int64_t after_first = 0;
          for (int round = 0; round < kRounds; ++round) {
            if (round == 1) after_first = faults();
            std::string s = LargeStringCache::Default().Take(kBytes);
            s.resize(kBytes, 'a');
            LargeStringCache::Default().Give(std::move(s));
          }
          cached = faults() - after_first;
          after_first = faults();
          for (int round = 0; round < kRounds - 1; ++round) {
            std::string s;
            s.resize(kBytes, 'a');
          }
          plain = faults() - after_first;
        });
        worker.join();
        const double touched = double(kRounds - 1) * kBytes;
        std::fprintf(stderr,
                     "faulted in after the first round: %.1f%% of the bytes through the cache, "
                     "%.1f%% as plain strings\n",
                     100.0 * double(cached) / touched, 100.0 * double(plain) / touched);
        std::_Exit(double(cached) < 0.05 * touched ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace gpucompute
