#include "proto/host_memory.h"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <utility>

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

// Asks for transparent huge pages on the whole 2 MiB pages inside
// [data, data + bytes): a fresh 64 MiB buffer otherwise takes 16384 page
// faults. Advice only: where the kernel declines, normal pages serve.
void AdviseHugePages(const void* data, size_t bytes) {
#if defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
}

}  // namespace

LargeStringCache& LargeStringCache::Default() {
  static LargeStringCache* const cache = new LargeStringCache();
  return *cache;
}

void LargeStringCache::SetCapacity(int64_t capacity_bytes) {
  std::vector<std::string> dropped;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  capacity_bytes_ = std::max<int64_t>(capacity_bytes, 0);
  while (kept_bytes_ > capacity_bytes_) {
    kept_bytes_ -= static_cast<int64_t>(kept_.front().capacity());
    dropped.push_back(std::move(kept_.front()));
    kept_.erase(kept_.begin());
  }
}

std::string LargeStringCache::Take(size_t bytes) {
  if (bytes < kMinBytes) {
    std::string s;
    s.reserve(bytes);
    return s;
  }
  std::vector<std::string> dropped;  // freed outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto fits = [bytes](const std::string& s) {
      return s.capacity() >= bytes && s.capacity() / 2 <= bytes;
    };
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (fits(*it) && (best == kept_.end() || it->capacity() < best->capacity())) best = it;
    }
    if (best != kept_.end()) {
      std::string s = std::move(*best);
      kept_.erase(best);
      kept_bytes_ -= static_cast<int64_t>(s.capacity());
      return s;
    }
    for (auto it = kept_.begin();
         it != kept_.end() && kept_bytes_ + static_cast<int64_t>(bytes) > capacity_bytes_;) {
      if (!fits(*it)) {
        kept_bytes_ -= static_cast<int64_t>(it->capacity());
        dropped.push_back(std::move(*it));
        it = kept_.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::string s;
  s.reserve(bytes);  // allocated, not yet touched
  AdviseHugePages(s.data(), s.capacity());
  return s;
}

void LargeStringCache::Give(std::string&& s) {
  std::string given = std::move(s);
  const int64_t size = static_cast<int64_t>(given.capacity());
  if (given.capacity() < kMinBytes) return;
  std::vector<std::string> dropped;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  if (size > capacity_bytes_) {
    dropped.push_back(std::move(given));
    return;
  }
  while (kept_bytes_ + size > capacity_bytes_) {
    auto longest = std::max_element(
        kept_.begin(), kept_.end(),
        [](const std::string& a, const std::string& b) { return a.capacity() < b.capacity(); });
    kept_bytes_ -= static_cast<int64_t>(longest->capacity());
    dropped.push_back(std::move(*longest));
    kept_.erase(longest);
  }
  given.clear();
  kept_.push_back(std::move(given));
  kept_bytes_ += size;
}

int64_t LargeStringCache::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

absl::Status KeepFreedHostMemory(int64_t retain_bytes, int arenas) {
  if (retain_bytes < 0 || retain_bytes > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("retain_bytes: expected 0 to ", INT_MAX, " but got ", retain_bytes));
  }
  if (arenas < 1) {
    return absl::InvalidArgumentError(absl::StrCat("arenas: expected >= 1 but got ", arenas));
  }
  if (retain_bytes == 0) return absl::OkStatus();
  LargeStringCache::Default().SetCapacity(retain_bytes);
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

namespace {
std::atomic<int64_t> g_foreign_resident_bytes{0};
}  // namespace

void AddForeignResidentBytes(int64_t delta) { g_foreign_resident_bytes.fetch_add(delta); }

int64_t ForeignResidentBytes() { return g_foreign_resident_bytes.load(); }

HostMemoryTrimmer::HostMemoryTrimmer(int64_t retain_bytes, absl::Duration period)
    : retain_bytes_(std::max<int64_t>(retain_bytes, 0)),
      base_bytes_(
          std::max<int64_t>(ResidentBytes() - AllocatedBytes() - ForeignResidentBytes(), 0)) {
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
  // The cache's buffers are allocated, as the allocator sees them.
  return std::max<int64_t>(
             ResidentBytes() - AllocatedBytes() - ForeignResidentBytes() - base_bytes_, 0) +
         LargeStringCache::Default().kept_bytes();
}

bool HostMemoryTrimmer::Trim() {
  if (KeptFreeBytes() <= retain_bytes_ + kSlackBytes) return false;
  // The pad is what the top of the main heap keeps (what the cache does not);
  // every other free page goes back.
  const int64_t pad =
      std::max<int64_t>(retain_bytes_ - LargeStringCache::Default().kept_bytes(), 0);
  malloc_trim(static_cast<size_t>(std::min<int64_t>(pad, INT_MAX)));
  return true;
}

}  // namespace gpucompute
