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
};

// The devices of one backend.
struct DeviceSet {
  std::string backend;  // "cpu" or "cuda"
  std::vector<std::unique_ptr<Device>> devices;
  // Attention head dimensions every device implements, ascending.
  std::vector<int64_t> head_dims;
};

// True when this build has a CUDA backend and a GPU is usable.
bool CudaAvailable();

// Creates the devices `options` ask for. Errors: INVALID_ARGUMENT naming the
// flag (unknown backend, weights that do not match the device count or are
// not > 0, --devices on the CPU backend, --cpu_devices < 1, --gpu_lanes
// outside [1, 64], --staging_copy_threads outside [0, 64]),
// FAILED_PRECONDITION when "cuda" is asked of a build or machine without it,
// or the backend's own error.
absl::StatusOr<DeviceSet> CreateDevices(const BackendOptions& options);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_BACKENDS_H_
