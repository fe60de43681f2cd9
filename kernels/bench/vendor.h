// Helpers for the vendor baselines (cuBLAS, cuBLASLt) that the benchmarks
// time beside our versions.
#ifndef GPUCOMPUTE_KERNELS_BENCH_VENDOR_H_
#define GPUCOMPUTE_KERNELS_BENCH_VENDOR_H_

#include <cublas_v2.h>
#include <library_types.h>

#include <cstdio>
#include <cstdlib>

#include "gpucompute/kernels/common.h"

// Aborts the benchmark with the failing call when a cuBLAS call fails.
#define GC_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                 \
    cublasStatus_t gc_st_ = (expr);                                                    \
    if (gc_st_ != CUBLAS_STATUS_SUCCESS) {                                             \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, \
                   int(gc_st_));                                                       \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace gpucompute::bench {

// The CUDA library type of a kernels dtype.
inline cudaDataType_t CudaType(kernels::DType t) {
  return t == kernels::DType::kF32 ? CUDA_R_32F
                                   : (t == kernels::DType::kF16 ? CUDA_R_16F : CUDA_R_16BF);
}

}  // namespace gpucompute::bench

#endif  // GPUCOMPUTE_KERNELS_BENCH_VENDOR_H_
