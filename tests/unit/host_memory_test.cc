// The allocator setting that lets large messages reuse freed memory: checked
// through glibc's own statistics, in a thread of its own as gRPC's would be.
#include "proto/host_memory.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdint>
#include <cstring>
#include <thread>

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

}  // namespace
}  // namespace gpucompute
