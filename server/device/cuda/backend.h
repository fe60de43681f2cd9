// The CUDA backend: finds the GPUs, creates one CudaDevice per GPU, enables
// peer access between them and calibrates their weights.
#ifndef GPUCOMPUTE_SERVER_DEVICE_CUDA_BACKEND_H_
#define GPUCOMPUTE_SERVER_DEVICE_CUDA_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/device/cuda/cuda_device.h"
#include "server/device/device.h"
#include "server/device/host_arena.h"

namespace gpucompute::cuda {

// Staging copy threads per GPU when CudaDeviceOptions::copy_threads is 0:
// the host's cores shared among the GPUs, at most this many.
// (16 copied one large transfer faster than 8 on a 16-core H200 host, but
// slowed eight concurrent downloads by 35-40%: gc_bench_device_path and
// bench-data-path.sh, deploy/results/data-path.md.)
inline constexpr int kMaxAutoCopyThreads = 8;

// Number of usable GPUs (0 when there is no driver or no device).
int CountUsableGpus();

// Creates one CudaDevice per ordinal in `ordinals` (all GPUs when empty),
// with server indices 0..n-1, enables peer access between every pair that
// allows it (recorded as each device's peers), and sets weights: `weights`
// when given (one per device), otherwise calibrated by a short GEMM and copy
// on each device. options.copy_threads 0 picks the copy threads as
// kMaxAutoCopyThreads says. Errors: NOT_FOUND without a GPU, INVALID_ARGUMENT for a bad
// ordinal or weight count, or the CUDA error.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateCudaDevices(
    const std::vector<int>& ordinals, const std::vector<double>& weights,
    const CudaDeviceOptions& options);

// Pinned host memory of `bytes` (rounded up to HostArena::kAlignment), made
// with GPU `ordinal` current and usable by every GPU (portable): what large
// request operands are decoded into, so that they reach a GPU by DMA alone.
// Errors: RESOURCE_EXHAUSTED naming --request_staging_bytes when the memory
// cannot be pinned.
absl::StatusOr<std::unique_ptr<HostArena>> CreatePinnedArena(int ordinal, int64_t bytes);

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_DEVICE_CUDA_BACKEND_H_
