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

// Where a tensor's bytes live: host memory, or the memory of the device with
// this index (a resident tensor; on the CPU backend that is host memory too).
inline constexpr int kHostMemory = -1;

// A dense row-major tensor whose bytes are owned elsewhere (the request
// message, or a resident tensor). Valid while the owner lives.
struct TensorView {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // NumElements(shape) * DTypeSize(dtype) bytes
  int device = kHostMemory;    // where `data` lives

  int64_t num_elements() const { return NumElements(shape); }
  size_t num_bytes() const { return size_t(num_elements()) * DTypeSize(dtype); }
};

// Where an operation writes a result: the full output's first byte and where
// it lives (host memory, or a device's memory for a result kept resident).
struct OutputView {
  OutputView() = default;
  // Host memory at `host` (null: no output). Implicit, so that a host
  // buffer reads as what it is.
  OutputView(void* host) : data(host) {}  // NOLINT(google-explicit-constructor)
  OutputView(void* data, int device) : data(data), device(device) {}
  explicit operator bool() const { return data != nullptr; }

  void* data = nullptr;
  int device = kHostMemory;
};

// A dense row-major tensor that owns its bytes. `data` is a std::string so
// that it can be swapped into a protobuf bytes field without a copy.
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;

  // Allocates zero-filled storage for `shape` elements of `dtype` (a string, so
  // that a response can take the bytes without a copy; large ones from
  // LargeStringCache::Default(), which keeps them for reuse when given back).
  static HostTensor Allocate(DType dtype, std::vector<int64_t> shape);
  int64_t num_elements() const { return NumElements(shape); }
  void* mutable_data() { return data.data(); }
  TensorView view() const { return {dtype, shape, data.data()}; }
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_COMMON_TENSOR_H_
