#include "server/common/tensor.h"

#include <cstdint>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace gpucompute {
namespace {

// Outputs at least this large ask for transparent huge pages before their
// first touch: a fresh 64 MiB buffer otherwise takes 16384 page faults, which
// cost more than most operations that fill it.
constexpr size_t kHugePageAdviceBytes = size_t{8} << 20;
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

void AdviseHugePages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  // Advice only: where the kernel declines, the buffer uses normal pages.
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
}

}  // namespace

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

HostTensor HostTensor::Allocate(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t bytes = size_t(NumElements(t.shape)) * DTypeSize(dtype);
  if (bytes >= kHugePageAdviceBytes) {
    t.data.reserve(bytes);  // allocated, not yet touched
    AdviseHugePages(t.data.data(), bytes);
  }
  t.data.resize(bytes);
  return t;
}

}  // namespace gpucompute
