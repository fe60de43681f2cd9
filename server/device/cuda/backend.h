// The CUDA backend: finds the GPUs, creates one CudaDevice per GPU, enables
// peer access between them and calibrates their weights.
#ifndef GPUCOMPUTE_SERVER_DEVICE_CUDA_BACKEND_H_
#define GPUCOMPUTE_SERVER_DEVICE_CUDA_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/device/cuda/cuda_device.h"
#include "server/device/device.h"

namespace gpucompute::cuda {

// Number of usable GPUs (0 when there is no driver or no device).
int CountUsableGpus();

// Creates one CudaDevice per ordinal in `ordinals` (all GPUs when empty),
// with server indices 0..n-1, enables peer access between every pair that
// allows it (recorded as each device's peers), and sets weights: `weights`
// when given (one per device), otherwise calibrated by a short GEMM and copy
// on each device. Errors: NOT_FOUND without a GPU, INVALID_ARGUMENT for a bad
// ordinal or weight count, or the CUDA error.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateCudaDevices(
    const std::vector<int>& ordinals, const std::vector<double>& weights,
    const CudaDeviceOptions& options);

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_DEVICE_CUDA_BACKEND_H_
