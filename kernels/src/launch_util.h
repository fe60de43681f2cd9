// Host-only helpers for sizing launches, shared by the kernel files. Compiles
// with g++ as well as nvcc.
#ifndef GPUCOMPUTE_KERNELS_SRC_LAUNCH_UTIL_H_
#define GPUCOMPUTE_KERNELS_SRC_LAUNCH_UTIL_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace gpucompute::kernels {

// ceil(a / b). REQUIRES: a >= 0, b > 0, a + b - 1 does not overflow.
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// SMs of the calling thread's current device, the count that sizes persistent
// and one-wave grids. Asked on every call rather than cached once per process:
// one process drives several GPUs and the current device changes between
// calls (the attribute lookup is cheap). When there is no usable device
// returns 132, the H200's count, so that planning still gives an answer (the
// launch that follows reports the failure), and clears the error the failed
// query recorded so that the caller's next cudaGetLastError does not see it.
inline int SmCount() {
  constexpr int kFallback = 132;
  int dev = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return kFallback;
  }
  return sms > 0 ? sms : kFallback;
}

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_LAUNCH_UTIL_H_
