#include "proto/host_memory.h"

#include <malloc.h>

#include <climits>

#include "absl/strings/str_cat.h"

namespace gpucompute {

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
  return absl::OkStatus();
}

}  // namespace gpucompute
