// Transpose and permute: which route and rung the default (an empty variant)
// runs. Host-only; transpose.cu and permute.cu ask it and launch what it names.
//
// Derived from the server-path sweep (tests/sweep/memops_sweep.cc; table and
// command in kernels/bench/results/sweep-memops.md), which times every route
// and rung that applies on every shape of its list:
//   - a batched 2-D transpose ([B, R, C] -> [B, C, R]): "coarsened" for fp32
//     and for small or unaligned shapes, the 16-byte swizzled tile in the
//     banded order ("coarsened_vec_grouped") for large 16-bit ones;
//   - the last axis kept (head permutations such as (0,2,1,3)): a copy of
//     whole rows in 16-byte vectors, one vector per thread with four in
//     flight ("row_copy"); rows that are not whole 16-byte vectors: "gather";
//   - any other permutation: one thread per output element ("gather"); the
//     32x32 shared-memory tile between the two moving axes ("tiled") lost to
//     it on every such shape.
#ifndef GPUCOMPUTE_KERNELS_SRC_HEURISTICS_TRANSPOSE_HEURISTICS_H_
#define GPUCOMPUTE_KERNELS_SRC_HEURISTICS_TRANSPOSE_HEURISTICS_H_

#include <cstdint>
#include <string_view>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// A batched 2-D transpose [batch, rows, cols] -> [batch, cols, rows].
struct TransposeShape {
  int64_t batch = 1, rows = 0, cols = 0;
  DType dtype = DType::kF32;
  bool vector_ok = false;  // rows, cols and pointers allow 16-byte access
};

// Below this many elements the 16-byte rungs' larger tiles leave the machine
// half empty: the 32x32 tile of "coarsened" is faster there.
inline constexpr int64_t kTransposeSmallElements = int64_t{1} << 18;

// The transpose rung to run (one of TransposeVariants()). fp32: "coarsened"
// (the 16-byte tile never beat it in the sweep, by 0-15%); 16-bit: the
// 16-byte tile in the banded order, except on small or unaligned shapes.
inline std::string_view ChooseTranspose(const TransposeShape& s, int sm_count) {
  (void)sm_count;
  if (!s.vector_ok || DTypeSize(s.dtype) == 4) return "coarsened";
  if (s.batch * s.rows * s.cols < kTransposeSmallElements) return "coarsened";
  return "coarsened_vec_grouped";
}

// The route for a permutation that keeps the last axis, whose rows move in
// vectors of `vec_bytes`: "row_copy" (16-byte vectors), else "gather"
// (narrower vectors: its one element per thread, with no loop, was faster
// than the row copy on every such shape of the sweep).
inline std::string_view ChooseRowCopy(int vec_bytes) {
  return vec_bytes >= 16 ? "row_copy" : "gather";
}

// The route for a permutation that moves the last axis without being a
// batched 2-D transpose: "gather". The tiled route was slower on every such
// shape of the sweep (0.6-0.9x of gather: its tiles read and write 32 rows
// far apart in memory); it stays as a variant.
inline std::string_view ChooseGeneral() { return "gather"; }

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_HEURISTICS_TRANSPOSE_HEURISTICS_H_
