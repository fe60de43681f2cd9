// Host tensors: a borrowed read-only view and an owning tensor.
#ifndef GPUCOMPUTE_SERVER_COMMON_TENSOR_H_
#define GPUCOMPUTE_SERVER_COMMON_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/dtype.h"

namespace gpucompute {

// Product of the dimensions (1 for an empty shape). REQUIRES: validated shape
// (non-negative, product fits in int64).
int64_t NumElements(const std::vector<int64_t>& shape);

// A dense row-major tensor whose bytes are owned elsewhere (typically the
// request message). Valid while the owner lives.
struct TensorView {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // NumElements(shape) * DTypeSize(dtype) bytes

  int64_t num_elements() const { return NumElements(shape); }
  size_t num_bytes() const { return size_t(num_elements()) * DTypeSize(dtype); }
};

// A dense row-major tensor that owns its bytes. `data` is a std::string so
// that it can be swapped into a protobuf bytes field without a copy.
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;

  // Allocates zero-filled storage for `shape` elements of `dtype` (a string, so
  // that a response can take the bytes without a copy; large ones on huge pages).
  static HostTensor Allocate(DType dtype, std::vector<int64_t> shape);
  int64_t num_elements() const { return NumElements(shape); }
  void* mutable_data() { return data.data(); }
  TensorView view() const { return {dtype, shape, data.data()}; }
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_COMMON_TENSOR_H_
