// Transpose and permute: which route and rung the default (an empty variant)
// runs. Host-only; transpose.cu and permute.cu ask it and launch what it names.
//
// Derived from the server-path sweep (tests/sweep/memops_sweep.cc; table and
// command in kernels/bench/results/sweep-memops.md), which times every route
// and rung that applies on every shape of its list, and from the tile study
// on the H200 whose figures are in transpose.cu:
//   - a batched 2-D transpose ([B, R, C] -> [B, C, R]): 16-bit elements with
//     even rows and cols move as 2x2 blocks of 32-bit words ("pairs", or
//     "pairs_64" when an extent is under 128); everything else takes the
//     64x64 padded tile ("coarsened_64": any shape and alignment);
//   - the last axis kept (head permutations such as (0,2,1,3)): a copy of
//     whole rows in the widest vectors they allow, one vector per thread
//     with four in flight ("row_copy");
//   - any other permutation: the 64x64 shared-memory tile between the input's
//     last axis and the output's ("tiled"); one thread per output element
//     ("gather") stays as a variant.
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
  bool pairs_ok = false;  // 16-bit, even rows and cols, 4-byte aligned pointers
};

// Extent under which the 128x128 tile of "pairs" would run half empty.
inline constexpr int64_t kTransposePairsMinExtent = 128;

// The transpose rung to run (one of TransposeVariants()). The 64x64 tiles
// reached 0.94-0.99x of a D2D copy from 4096^2 to 16384^2 (fp32) where the
// 16-byte tiles of "coarsened_vec*" stopped at 0.76-0.80 (fp32) and 0.52-0.64
// (16-bit); 16-bit pairs reached 0.92-0.96x where the plain 16-bit 64x64 tile
// reached 0.77-0.85.
inline std::string_view ChooseTranspose(const TransposeShape& s, int sm_count) {
  (void)sm_count;
  if (DTypeSize(s.dtype) == 2 && s.pairs_ok) {
    const bool wide = s.rows >= kTransposePairsMinExtent && s.cols >= kTransposePairsMinExtent;
    return wide ? "pairs" : "pairs_64";
  }
  return "coarsened_64";
}

// The route for a permutation that keeps the last axis, whose rows move in
// vectors of `vec_bytes` (16, 8, 4 or 2): "row_copy". Once its index math
// stopped spilling the parameter arrays to a stack frame it led gather at
// every vector width of the sweep (2026-12-01 23:08 UTC: [33,257,129]
// (1,0,2), 4-byte vectors, 4.9 us against 6.2; [4,7,300,65] (0,2,1,3),
// 4-byte, 3.5-3.6 against 3.6-3.7; 16-byte head permutations 2.4-5.2x).
inline std::string_view ChooseRowCopy(int vec_bytes) {
  (void)vec_bytes;
  return "row_copy";
}

// The route for a permutation that moves the last axis without being a
// batched 2-D transpose: "tiled", its 64x64 tile with 32 elements per thread
// (the sweep of 2026-12-01 23:08 UTC: 1.7-5.2x gather on the 16 such cases
// of 4096 elements or more; the 32x32 tile it replaced lost to gather).
// Tensors smaller than one tile take "gather": one launch either way, and the
// tile's shared-memory round trip costs more than it saves ([2,3,4,5]
// (3,1,2,0): gather 1.02 us, tiled 1.86 us of device time).
inline constexpr int64_t kPermuteTiledMinElements = 64 * 64;
inline std::string_view ChooseGeneral(int64_t elements) {
  return elements < kPermuteTiledMinElements ? "gather" : "tiled";
}

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_SRC_HEURISTICS_TRANSPOSE_HEURISTICS_H_
