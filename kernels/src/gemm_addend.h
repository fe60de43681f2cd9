// GEMM's addend beta * C: where both ladders (gemm_tc.cu, gemm_simt.cu) read
// it, and whether C and that addend can be moved in aligned pieces.
// Host-only.
#ifndef GPUCOMPUTE_KERNELS_SRC_GEMM_ADDEND_H_
#define GPUCOMPUTE_KERNELS_SRC_GEMM_ADDEND_H_

#include <cstddef>
#include <cstdint>

#include "gpucompute/kernels/common.h"
#include "gpucompute/kernels/gemm.h"

namespace gpucompute::kernels {

// Where beta * C is read: c_in (batch stride stride_c_in) when the caller
// gave one and beta != 0, else C itself; `apart` tells which.
struct GemmAddend {
  const void* ptr = nullptr;
  int64_t stride = 0;
  bool apart = false;
};

inline GemmAddend ChooseGemmAddend(const GemmArgs& a) {
  const bool apart = a.beta != 0 && a.c_in != nullptr;
  return {apart ? a.c_in : a.c, apart ? a.stride_c_in : a.stride_c, apart};
}

// True when C, and the addend where it lies apart from C, have their base,
// rows (ldc) and batch stride on multiples of `bytes` (a power of two).
inline bool GemmCAligned(const GemmArgs& a, size_t bytes) {
  const int64_t es = static_cast<int64_t>(DTypeSize(a.c_type)), b = static_cast<int64_t>(bytes);
  auto on = [&](const void* ptr, int64_t stride) {
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0 && (a.ldc * es) % b == 0 &&
           (a.batch <= 1 || (stride * es) % b == 0);
  };
  const GemmAddend add = ChooseGemmAddend(a);
  return on(a.c, a.stride_c) && (!add.apart || on(add.ptr, add.stride));
}

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_GEMM_ADDEND_H_
