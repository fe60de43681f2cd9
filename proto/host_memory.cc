#include "proto/host_memory.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace gpucompute {
namespace {

// The process's resident set in bytes (/proc/self/statm); 0 when unreadable.
int64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size = 0, resident = 0;
  const int read = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return read == 2 ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// Bytes the allocator has handed out and not got back (every heap, and the
// blocks it mapped on their own).
int64_t AllocatedBytes() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

}  // namespace

absl::Status KeepFreedHostMemory(int64_t retain_bytes, int arenas) {
  if (retain_bytes < 0 || retain_bytes > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("retain_bytes: expected 0 to ", INT_MAX, " but got ", retain_bytes));
  }
  if (arenas < 1) {
    return absl::InvalidArgumentError(absl::StrCat("arenas: expected >= 1 but got ", arenas));
  }
  if (retain_bytes == 0) return absl::OkStatus();
  // mallopt returns 1 on success.
  if (mallopt(M_ARENA_MAX, arenas) != 1 || mallopt(M_MMAP_MAX, 0) != 1 ||
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(retain_bytes)) != 1) {
    return absl::InternalError("the C library refused an allocator setting (mallopt)");
  }
  // A further arena deletes a heap of its own as soon as it empties, unless
  // the heap before it lacks the top pad: a pad of a whole heap keeps them.
  if (arenas > 1 && mallopt(M_TOP_PAD, static_cast<int>(kArenaHeapBytes)) != 1) {
    return absl::InternalError("the C library refused an allocator setting (mallopt)");
  }
  return absl::OkStatus();
}

HostMemoryTrimmer::HostMemoryTrimmer(int64_t retain_bytes, absl::Duration period)
    : retain_bytes_(std::max<int64_t>(retain_bytes, 0)),
      base_bytes_(std::max<int64_t>(ResidentBytes() - AllocatedBytes(), 0)) {
  if (period == absl::InfiniteDuration()) return;
  thread_ = std::thread([this, period] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) return;
      }
      Trim();
    }
  });
}

HostMemoryTrimmer::~HostMemoryTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t HostMemoryTrimmer::KeptFreeBytes() const {
  return std::max<int64_t>(ResidentBytes() - AllocatedBytes() - base_bytes_, 0);
}

bool HostMemoryTrimmer::Trim() {
  if (KeptFreeBytes() <= retain_bytes_ + kSlackBytes) return false;
  // The pad is what the top of the main heap keeps; every other free page
  // goes back.
  malloc_trim(static_cast<size_t>(std::min<int64_t>(retain_bytes_, INT_MAX)));
  return true;
}

}  // namespace gpucompute
