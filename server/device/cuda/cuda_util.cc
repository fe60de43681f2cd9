#include "server/device/cuda/cuda_util.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace gpucompute::cuda {

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

bool IsStickyError(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorUnknown:
    case cudaErrorDevicesUnavailable:
      return true;
    default:
      return false;
  }
}

DeviceGuard::DeviceGuard(int ordinal) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (previous_ != ordinal) {
    changed_ = cudaSetDevice(ordinal) == cudaSuccess;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_ && previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace gpucompute::cuda
