// Element type conversion of a dense device array: fp32, fp16 and bf16 into
// one another, rounding to nearest even. The service uses it where a result
// is asked for in another dtype than the kernel wrote, so that the
// conversion stays on the device (one pass over the result).
#ifndef GPUCOMPUTE_KERNELS_CONVERT_H_
#define GPUCOMPUTE_KERNELS_CONVERT_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// out[i] = (to) in[i] for i < n. Device pointers aligned to their element
// sizes; `in` and `out` do not overlap (the same pointer with from == to is a
// no-op). NaN stays NaN; values past the range of fp16 become infinities.
// Returns cudaErrorInvalidValue for bad arguments, otherwise the launch
// status; n == 0 launches nothing.
cudaError_t LaunchConvert(const void* in, DType from, void* out, DType to, int64_t n,
                          cudaStream_t stream);

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_CONVERT_H_
