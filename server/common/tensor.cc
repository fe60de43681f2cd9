#include "server/common/tensor.h"

#include <cstdint>
#include <utility>

#include "proto/host_memory.h"

namespace gpucompute {

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
  t.data = LargeStringCache::Default().Take(bytes);
  t.data.resize(bytes);
  return t;
}

}  // namespace gpucompute
