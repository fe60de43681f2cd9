// How the process's C library allocator treats large blocks.
//
// Tensors arrive and leave as messages of up to 2 GB, and every message is
// held in a few freshly allocated buffers (gRPC's slices, protobuf's string,
// the result). By default glibc serves each block over 32 MiB by mmap and
// gives it back at free, so every large message page-faults all of its
// buffers in again, and other threads' arenas do the same for smaller ones.
// Keeping freed memory instead, measured on the 2-core development machine
// (`gpucompute bench echo`, loopback, server and CLI both set to keep 2 GiB):
// Echo of 64 MiB 0.92 -> 2.7 GB/s, 256 MiB 0.55 -> 2.6 GB/s, 512 MiB
// 0.52 -> 2.4 GB/s; a 64^3 GEMM at concurrency 16, 13-15k -> 19k requests/s.
// Keeping only 1 GiB, 512 MiB messages fell back to 0.87 GB/s: each one
// holds several buffers of its size at once.
#ifndef GPUCOMPUTE_PROTO_HOST_MEMORY_H_
#define GPUCOMPUTE_PROTO_HOST_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpucompute {

// Whether this build allocates with glibc's malloc. A sanitizer build
// (AddressSanitizer, ThreadSanitizer, MemorySanitizer) replaces it with the
// sanitizer's own, to which glibc's settings, statistics and trimming do not
// apply, and which keeps freed memory of its own (quarantine, shadow).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kGlibcMalloc = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
inline constexpr bool kGlibcMalloc = false;
#else
inline constexpr bool kGlibcMalloc = true;
#endif
#else
inline constexpr bool kGlibcMalloc = true;
#endif

// Serves every allocation from `arenas` heaps (glibc arenas) and keeps up to
// `retain_bytes` of freed memory for reuse (no mmap for large blocks, the
// trim threshold at `retain_bytes`), so that messages reuse memory already
// mapped. The price: the process keeps up to `retain_bytes` it no longer
// uses. One arena keeps every block in one pool, but all threads take its
// lock for every allocation. More arenas spread small allocations over
// locks; a further arena grows in heaps of kArenaHeapBytes, kept once made
// (the top pad is set to a whole heap: by default an emptied heap is
// unmapped, and blocks of a few MiB page-fault in again). A block larger
// than such a heap, allocated by a thread of a further arena, is mapped on
// its own and unmapped when freed (glibc has no other place for it), so it
// page-faults in every time. Call first thing in main, before threads
// start. It also lets LargeStringCache::Default() keep up to
// `retain_bytes`. `retain_bytes` == 0 leaves the allocator as it is. Errors:
// INVALID_ARGUMENT when `retain_bytes` is negative or over 2^31 - 1 or
// `arenas` < 1, INTERNAL when the allocator refuses a setting (a sanitizer's
// does: it is then used as it is).
absl::Status KeepFreedHostMemory(int64_t retain_bytes, int arenas = 1);
// The size of a further arena's heaps (glibc's HEAP_MAX_SIZE on 64 bits).
inline constexpr int64_t kArenaHeapBytes = int64_t{64} << 20;

// Keeps the buffers of large strings (a request's tensor bytes as decoded, a
// result's bytes, a resident tensor's on the CPU backend) for the next
// request of their size. The allocator cannot:
// with several arenas, a block larger than a further arena's heap
// (kArenaHeapBytes) is mapped on its own and unmapped when freed, so every
// such request page-faulted its buffers in anew (development machine, CPU
// backend, 8 arenas: a 128 MiB operand decoded in 75-400 ms, against 14 ms
// in memory already mapped). Thread-safe.
class LargeStringCache {
 public:
  // Strings with less capacity are neither served nor kept.
  static constexpr size_t kMinBytes = size_t{8} << 20;

  // Keeps at most `capacity_bytes` of free buffers (0: none).
  explicit LargeStringCache(int64_t capacity_bytes = 0) : capacity_bytes_(capacity_bytes) {}
  LargeStringCache(const LargeStringCache&) = delete;
  LargeStringCache& operator=(const LargeStringCache&) = delete;

  // The process's cache; KeepFreedHostMemory sets its capacity (0 before).
  static LargeStringCache& Default();

  void SetCapacity(int64_t capacity_bytes);
  // An empty string whose capacity is at least `bytes`. From kMinBytes on:
  // the smallest kept buffer that holds them and is at most twice as large
  // (so what a request holds stays within twice its bytes), else a fresh one
  // (advised to use huge pages, not yet touched); below, always a fresh one.
  // To make room for a fresh one, kept buffers that do not fit go first
  // (oldest first), as long as the cache is over its capacity with the fresh
  // one counted.
  std::string Take(size_t bytes);
  // Keeps `s`'s buffer for a later Take when its capacity is at least
  // kMinBytes and at most the cache's capacity (the longest kept go first to
  // make room); else frees it.
  void Give(std::string&& s);
  // The bytes of the buffers kept now.
  int64_t kept_bytes() const;

 private:
  mutable absl::Mutex mu_;
  int64_t capacity_bytes_ ABSL_GUARDED_BY(mu_);
  int64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Oldest first.
  std::vector<std::string> kept_ ABSL_GUARDED_BY(mu_);
};

// Memory the process keeps resident outside the C library's allocator on
// purpose, made once and held for long (pinned staging buffers, the request
// arena): HostMemoryTrimmer does not count it as freed memory kept. `delta`
// is negative when such memory is let go. Thread-safe.
void AddForeignResidentBytes(int64_t delta);
int64_t ForeignResidentBytes();

// Holds the allocator to its retention: the allocator gives memory back to
// the system only from the top of a heap, so freed blocks below one still in
// use stay resident whatever the trim threshold says (idle servers kept
// 2.9-4.1 GB after bursts of 200 MiB Echos with 2 GiB retained, 2.5 GB with
// the C library's defaults). Every `period` a thread measures the free
// memory the allocator keeps resident (the process's resident set less the
// bytes allocated, less ForeignResidentBytes() and less what was resident
// besides them when the trimmer started) and, when that is over `retain_bytes` plus kSlackBytes,
// has the allocator give back every free page inside its heaps and the top of each beyond
// `retain_bytes` (malloc_trim). `retain_bytes` is KeepFreedHostMemory's (0: the C library's
// defaults, and freed memory is given back within a period). The buffers
// LargeStringCache::Default() keeps count as kept free memory too.
class HostMemoryTrimmer {
 public:
  // What may be kept free beyond `retain_bytes` before trimming: thread
  // stacks and other memory started after the trimmer count as kept free.
  static constexpr int64_t kSlackBytes = int64_t{32} << 20;

  // Starts the thread (none when `period` is infinite: then only Trim()).
  explicit HostMemoryTrimmer(int64_t retain_bytes, absl::Duration period = absl::Seconds(1));
  // Stops the thread.
  ~HostMemoryTrimmer();
  HostMemoryTrimmer(const HostMemoryTrimmer&) = delete;
  HostMemoryTrimmer& operator=(const HostMemoryTrimmer&) = delete;

  // The free memory the allocator keeps resident now, as measured above.
  int64_t KeptFreeBytes() const;
  // Trims when KeptFreeBytes() is over retain_bytes + kSlackBytes; returns
  // true when it did.
  bool Trim();

 private:
  const int64_t retain_bytes_;
  // Resident bytes besides those allocated, when the trimmer started.
  const int64_t base_bytes_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_PROTO_HOST_MEMORY_H_
