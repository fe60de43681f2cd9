// Small CUDA runtime helpers for the CUDA device: error mapping and a guard
// for the current device. Host code only (compiled by the C++ compiler).
#ifndef GPUCOMPUTE_SERVER_DEVICE_CUDA_CUDA_UTIL_H_
#define GPUCOMPUTE_SERVER_DEVICE_CUDA_CUDA_UTIL_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gpucompute::cuda {

// OK for cudaSuccess; RESOURCE_EXHAUSTED for an allocation failure; INTERNAL
// with the CUDA message otherwise. `what` names the failing step.
absl::Status CudaStatus(cudaError_t err, absl::string_view what);

// True for errors after which the CUDA context is unusable (the device must
// be taken out of service).
bool IsStickyError(cudaError_t err);

// Makes `ordinal` the calling thread's current device for the guard's
// lifetime and restores the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_DEVICE_CUDA_CUDA_UTIL_H_
