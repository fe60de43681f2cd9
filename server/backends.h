// The backend factory: the one place that knows which Device implementations
// exist. Handlers and the engine see only the Device interface, so the CUDA
// backend slots in here.
#ifndef GPUCOMPUTE_SERVER_BACKENDS_H_
#define GPUCOMPUTE_SERVER_BACKENDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/device/device.h"
#include "server/device/host_arena.h"

namespace gpucompute {

// Which devices to create (the device flags of the server).
struct BackendOptions {
  // "auto" (CUDA when a GPU is usable, else CPU), "cpu" or "cuda".
  std::string backend = "auto";
  // GPU ordinals to use (CUDA only); empty = every GPU.
  std::vector<int> devices;
  // Relative compute weights, one per device; empty = equal (CPU) or
  // measured (CUDA).
  std::vector<double> device_weights;
  // Virtual CPU devices (CPU backend only).
  int cpu_devices = 1;
  // Per GPU: pinned staging memory, split among its lanes (CUDA only).
  int64_t pinned_staging_bytes = int64_t{256} << 20;
  // Per GPU: streams (lanes) that run shards at once (CUDA only).
  int gpu_lanes = 8;
  // Per GPU: staging copy threads; 0 = automatic (CUDA only).
  int staging_copy_threads = 0;
  // Host memory allocated once that large operands of operation requests are
  // decoded into (pinned on the CUDA backend, so they reach a GPU by DMA
  // alone); 0 = none, -1 = kDefaultRequestStagingBytes on the CUDA backend
  // and none on the CPU backend.
  int64_t request_staging_bytes = -1;
};

// The CUDA backend's request arena when --request_staging_bytes is left at
// -1: room for the operands of a few large requests at once (an 8192^3 bf16
// GEMM's two are 256 MiB); pinning it takes about 0.4 s at start.
inline constexpr int64_t kDefaultRequestStagingBytes = int64_t{1} << 30;

// The devices of one backend.
struct DeviceSet {
  std::string backend;  // "cpu" or "cuda"
  std::vector<std::unique_ptr<Device>> devices;
  // Attention head dimensions every device implements, ascending.
  std::vector<int64_t> head_dims;
  // Where large request operands are decoded (null: none); pinned on CUDA.
  // REQUIRES: outlives `devices` (their shards copy from it).
  std::unique_ptr<HostArena> request_arena;
};

// True when this build has a CUDA backend and a GPU is usable.
bool CudaAvailable();

// Creates the devices `options` ask for. Errors: INVALID_ARGUMENT naming the
// flag (unknown backend, weights that do not match the device count or are
// not > 0, --devices on the CPU backend, --cpu_devices < 1, --gpu_lanes
// outside [1, 64], --staging_copy_threads outside [0, 64],
// --request_staging_bytes under -1), RESOURCE_EXHAUSTED naming
// --request_staging_bytes when that memory cannot be had,
// FAILED_PRECONDITION when "cuda" is asked of a build or machine without it,
// or the backend's own error.
absl::StatusOr<DeviceSet> CreateDevices(const BackendOptions& options);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_BACKENDS_H_
