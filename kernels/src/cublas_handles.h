// cuBLAS handles for the vendor fallbacks that call cuBLAS itself (GEMV's
// "cublas" in gemv.cu, GEMM's "cublas" in gemm_vendor.cc). Host-only.
//
// One handle per (device, stream), made on first use and kept for the
// process's life: the server's streams are its lanes, each leased by one
// shard at a time, so a handle is never used by two threads at once, and
// their number stays bounded by the lanes. Each owner keeps its own pool (a
// handle's workspace setting is the owner's to make).
#ifndef GPUCOMPUTE_KERNELS_SRC_CUBLAS_HANDLES_H_
#define GPUCOMPUTE_KERNELS_SRC_CUBLAS_HANDLES_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

namespace gpucompute::kernels {

class CublasHandles {
 public:
  // The handle for `stream` on the current device, bound to that stream;
  // null when cuBLAS cannot make one. Split-K partial sums are kept in fp32
  // (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION): without it, cuBLAS
  // may add them up in a 16-bit output type (errors of ~1% at k = 1000, far
  // from our kernels' fp32 accumulation). Default atomics mode:
  // deterministic.
  cublasHandle_t Get(cudaStream_t stream) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find({device, stream});
    if (it != handles_.end()) return it->second;
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return nullptr;
    if (cublasSetStream(h, stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(h, cublasMath_t(CUBLAS_DEFAULT_MATH |
                                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)) !=
            CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(h);
      return nullptr;
    }
    handles_[{device, stream}] = h;
    return h;
  }

 private:
  std::mutex mu_;
  std::map<std::pair<int, cudaStream_t>, cublasHandle_t> handles_;
};

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_CUBLAS_HANDLES_H_
