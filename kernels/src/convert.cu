// Element type conversion: one thread per element, a grid sized to the
// machine that loops (memory bound: n * (size(from) + size(to)) bytes).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "gpucompute/kernels/convert.h"
#include "launch_util.h"

namespace gpucompute::kernels {
namespace {

__device__ __forceinline__ float Load(const void* p, int64_t i, DType t) {
  if (t == DType::kF32) return static_cast<const float*>(p)[i];
  if (t == DType::kF16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ void Store(void* p, int64_t i, DType t, float v) {
  if (t == DType::kF32)
    static_cast<float*>(p)[i] = v;
  else if (t == DType::kF16)
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  else
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}

__global__ void __launch_bounds__(256)
    ConvertKernel(const void* in, DType from, void* out, DType to, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    Store(out, i, to, Load(in, i, from));
}

bool Valid(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

}  // namespace

cudaError_t LaunchConvert(const void* in, DType from, void* out, DType to, int64_t n,
                          cudaStream_t stream) {
  if (n < 0 || !Valid(from) || !Valid(to)) return cudaErrorInvalidValue;
  if (n == 0 || (in == out && from == to)) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (from == to)
    return cudaMemcpyAsync(out, in, size_t(n) * DTypeSize(to), cudaMemcpyDeviceToDevice, stream);
  const int64_t blocks = std::min<int64_t>(CeilDiv(n, 256), int64_t(SmCount()) * 16);
  ConvertKernel<<<unsigned(blocks), 256, 0, stream>>>(in, from, out, to, n);
  return cudaGetLastError();
}

}  // namespace gpucompute::kernels
