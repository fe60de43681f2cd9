// Host-side checks and grid sizing shared by the transpose ladder
// (transpose.cu) and the general permutation built on it (permute.cu).
// Included by those two files only.
#ifndef GPUCOMPUTE_KERNELS_SRC_TRANSPOSE_COMMON_H_
#define GPUCOMPUTE_KERNELS_SRC_TRANSPOSE_COMMON_H_

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "gpucompute/kernels/common.h"
#include "launch_util.h"

namespace gpucompute::kernels {

inline bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// fp32, fp16 or bf16; false for a value outside the enum.
inline bool ValidDType(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// Blocks for `work_items` at `per_block` each, clamped to [1, INT_MAX] so the
// grid is launchable; kernels loop over what a clamped grid leaves.
inline unsigned GridFor(int64_t work_items, int64_t per_block) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(CeilDiv(work_items, per_block), INT_MAX)));
}

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_TRANSPOSE_COMMON_H_
