// The allocator setting that lets large messages reuse freed memory: checked
// through glibc's own statistics, in a thread of its own as gRPC's would be.
#include "proto/host_memory.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdint>
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
