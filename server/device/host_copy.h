// Copies between host buffers for the devices' staging paths.
#ifndef GPUCOMPUTE_SERVER_DEVICE_HOST_COPY_H_
#define GPUCOMPUTE_SERVER_DEVICE_HOST_COPY_H_

#include <cstddef>

namespace gpucompute {

// memcpy(dst, src, n) with non-temporal stores: the destination's lines are
// written without first being read into the caches (no read for
// ownership), which leaves the memory bus to the copy's own reads and
// writes. Worth it only for copies far larger than the caches. Any
// alignment and any n; the stores are fenced before it returns, so another
// thread or a DMA engine that is told afterwards sees them. Without SSE2 it
// is memcpy. REQUIRES: the ranges do not overlap.
void CopyStreaming(void* dst, const void* src, size_t n);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_DEVICE_HOST_COPY_H_
