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

#include <cstdint>

#include "absl/status/status.h"

namespace gpucompute {

// Serves every allocation from `arenas` heaps (glibc arenas; a block larger
// than a further arena's 64 MiB heap always comes from the first) and keeps
// up to `retain_bytes` of freed memory for reuse (no mmap for large blocks,
// the trim threshold at `retain_bytes`), so that messages reuse memory
// already mapped. The price: the process keeps up to `retain_bytes` it no
// longer uses. One arena keeps every block in one pool, but all threads take
// its lock for every allocation; more arenas spread small allocations over
// locks, but a further arena's heap is unmapped when it empties, so blocks of
// a few MiB there page-fault in again. Call first thing in main, before
// threads start. `retain_bytes` == 0 leaves the allocator as it is. Errors:
// INVALID_ARGUMENT when `retain_bytes` is negative or over 2^31 - 1 or
// `arenas` < 1, INTERNAL when the allocator refuses a setting (a sanitizer's
// does: it is then used as it is).
absl::Status KeepFreedHostMemory(int64_t retain_bytes, int arenas = 1);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_PROTO_HOST_MEMORY_H_
