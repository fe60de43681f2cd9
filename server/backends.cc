#include "server/backends.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/core/ops.h"
#include "server/device/cpu/cpu_device.h"
#ifdef GPUCOMPUTE_WITH_CUDA
#include "server/device/cuda/backend.h"
#endif

namespace gpucompute {
namespace {

absl::Status CheckWeights(const std::vector<double>& weights, int num_devices) {
  if (weights.empty()) return absl::OkStatus();
  if (static_cast<int>(weights.size()) != num_devices) {
    return absl::InvalidArgumentError(absl::StrCat("--device_weights: expected ", num_devices,
                                                   " weights (one per device) but got ",
                                                   weights.size()));
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--device_weights: weight ", i, " is ",
                                                     weights[i], "; expected a finite value > 0"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceSet> CreateCpu(const BackendOptions& options) {
  if (!options.devices.empty()) {
    return absl::InvalidArgumentError(
        "--devices selects GPUs (CUDA ordinals); the CPU backend takes --cpu_devices");
  }
  if (options.cpu_devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu_devices: expected at least 1 but got ", options.cpu_devices));
  }
  RETURN_IF_ERROR(CheckWeights(options.device_weights, options.cpu_devices));
  DeviceSet set;
  set.backend = "cpu";
  set.head_dims = AttentionHeadDims();
  set.devices = CreateCpuDevices(options.cpu_devices, options.device_weights);
  if (options.request_staging_bytes > 0) {
    set.request_arena = HostArena::AllocateHost(size_t(options.request_staging_bytes));
    if (set.request_arena == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("--request_staging_bytes: cannot allocate ", options.request_staging_bytes,
                       " bytes of host memory; ask for less, or 0 for none"));
    }
  }
  return set;
}

}  // namespace

#ifdef GPUCOMPUTE_WITH_CUDA
namespace {

absl::StatusOr<DeviceSet> CreateCuda(const BackendOptions& options) {
  if (options.cpu_devices != 1) {
    return absl::InvalidArgumentError(
        "--cpu_devices applies to the CPU backend; the CUDA backend takes --devices");
  }
  for (size_t i = 0; i < options.device_weights.size(); ++i) {
    if (!std::isfinite(options.device_weights[i]) || options.device_weights[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--device_weights: weight ", i, " is ",
                                                     options.device_weights[i],
                                                     "; expected a finite value > 0"));
    }
  }
  DeviceSet set;
  set.backend = "cuda";
  // Head dimensions the CUDA attention takes: the flash kernels run every
  // one of them (on tiles 64, 128, 192 or 256 wide, zero past D).
  set.head_dims = AttentionHeadDims();
  cuda::CudaDeviceOptions cuda_options;
  cuda_options.lanes = options.gpu_lanes;
  cuda_options.copy_threads = options.staging_copy_threads;
  // The staging ring of each lane: its buffers of one chunk each.
  const int64_t per_buffer =
      options.pinned_staging_bytes / (cuda_options.lanes * cuda_options.staging.buffers);
  if (per_buffer < (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pinned_staging_bytes: ", options.pinned_staging_bytes,
                     " leaves less than 1 MiB per "
                     "staging buffer; expected at least ",
                     int64_t{cuda_options.lanes} * cuda_options.staging.buffers << 20));
  }
  cuda_options.staging.chunk_bytes = size_t(per_buffer);
  ASSIGN_OR_RETURN(set.devices,
                   cuda::CreateCudaDevices(options.devices, options.device_weights, cuda_options));
  const int64_t arena_bytes = options.request_staging_bytes < 0 ? kDefaultRequestStagingBytes
                                                                : options.request_staging_bytes;
  if (arena_bytes > 0) {
    ASSIGN_OR_RETURN(set.request_arena,
                     cuda::CreatePinnedArena(options.devices.empty() ? 0 : options.devices.front(),
                                             arena_bytes));
  }
  return set;
}

}  // namespace
#endif

bool CudaAvailable() {
#ifdef GPUCOMPUTE_WITH_CUDA
  return cuda::CountUsableGpus() > 0;
#else
  return false;
#endif
}

absl::StatusOr<DeviceSet> CreateDevices(const BackendOptions& options) {
  // Checked whatever the backend, like the other flags of a server.
  if (options.gpu_lanes < 1 || options.gpu_lanes > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_lanes: expected 1 to 64 but got ", options.gpu_lanes));
  }
  if (options.staging_copy_threads < 0 || options.staging_copy_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--staging_copy_threads: expected 0 (automatic) to 64 but got ",
                     options.staging_copy_threads));
  }
  if (options.request_staging_bytes < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--request_staging_bytes: expected -1 (the backend's default), 0 (none) or "
                     "a size in bytes but got ",
                     options.request_staging_bytes));
  }
  if (options.backend == "cpu") return CreateCpu(options);
  if (options.backend == "cuda") {
#ifdef GPUCOMPUTE_WITH_CUDA
    if (!CudaAvailable()) {
      return absl::FailedPreconditionError("--backend=cuda: no usable CUDA device");
    }
    return CreateCuda(options);
#else
    return absl::FailedPreconditionError(
        "--backend=cuda: the CUDA backend is not available in this build");
#endif
  }
  if (options.backend == "auto") {
#ifdef GPUCOMPUTE_WITH_CUDA
    // --cpu_devices asks for the CPU backend explicitly.
    if (CudaAvailable() && options.cpu_devices == 1) return CreateCuda(options);
#endif
    return CreateCpu(options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend: expected auto, cpu or cuda but got \"", options.backend, "\""));
}

}  // namespace gpucompute
