// Transpose and general axis permutation of dense row-major tensors.
//
// The ladder (src/transpose.cu) moves [B, R, C] -> [B, C, R] for 2- and
// 4-byte elements; LaunchPermute (src/permute.cu) builds the service's
// Transpose RPC on it: any permutation of up to four axes, routed to a batched
// row copy when the last axis stays in place, to the transpose ladder when the
// permutation is a batched 2-D transpose, and to a general gather kernel
// otherwise.
#ifndef GPUCOMPUTE_KERNELS_TRANSPOSE_H_
#define GPUCOMPUTE_KERNELS_TRANSPOSE_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpucompute/kernels/common.h"

namespace gpucompute::kernels {

// out[b][c][r] = in[b][r][c]; both dense row-major, device pointers that do
// not overlap. Element pointers must be aligned to the element size.
struct TransposeArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t batch = 1;
  int64_t rows = 0;  // R
  int64_t cols = 0;  // C
  DType dtype = DType::kF32;
};

// Every rung by name, in ladder order:
//   "naive"                  one thread per element, strided writes;
//   "smem"                   32x32 shared-memory tile, bank conflicts on the
//                            column read;
//   "smem_padded"            the same tile padded to [32][33];
//   "coarsened"              32x8 threads, each moving 4 rows of a padded tile
//                            (any shape and alignment);
//   "coarsened_vec"          16-byte accesses on both sides through a swizzled
//                            tile;
//   "coarsened_vec_grouped"  the same, tiles visited in bands of tile rows;
//   "pipelined"              persistent blocks, cp.async multi-stage tiles;
//   "pipelined_grouped"      the same in the banded order;
//   "coarsened_64"           a 64x64 padded tile, 64 bytes per thread each way
//                            (any shape and alignment);
//   "pairs"                  fp16/bf16 moved as 2x2 blocks of two 32-bit words
//                            through a 128x128 tile;
//   "pairs_64"               the same through a 64x64 tile.
// coarsened_vec .. pipelined_grouped need rows and cols divisible by 16 /
// element size and 16-byte aligned pointers; pairs and pairs_64 need 16-bit
// elements, even rows and cols and 4-byte aligned pointers. The default is the
// fastest measured: pairs (pairs_64 when an extent is under 128) where they
// run, else coarsened_64.
const std::vector<std::string>& TransposeVariants();

// Ok when `variant` (empty = fastest for the arguments) can run `args`;
// otherwise the reason.
Support CanImplementTranspose(const TransposeArgs& args, std::string_view variant);

// The rung LaunchTranspose runs: `variant` itself, or the default's choice
// (src/heuristics/transpose_heuristics.h) when empty. Empty when refused.
std::string TransposeVariantName(const TransposeArgs& args, std::string_view variant);

// Enqueues the transpose on `stream`. Returns cudaErrorInvalidValue when
// CanImplementTranspose refuses, otherwise the launch status. Zero-sized
// tensors launch nothing.
cudaError_t LaunchTranspose(const TransposeArgs& args, std::string_view variant,
                            cudaStream_t stream);

// numpy.transpose semantics: out.shape[i] = in.shape[perm[i]], both dense
// row-major; entries past `rank` are ignored.
struct PermuteArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int rank = 0;  // 1..4
  int64_t shape[4] = {1, 1, 1, 1};
  int perm[4] = {0, 1, 2, 3};
  DType dtype = DType::kF32;
};

// Ok when `perm` is a permutation of 0..rank-1, shapes are non-negative and the
// pointers are set and aligned to the element size. `variant` is empty (the
// default route), a route name, or a transpose rung:
//   "copy"              permutations that move nothing (one D2D copy);
//   "row_copy"          the last axis kept: 16-byte vectors (where aligned),
//                       one per thread, four in flight;
//   "row_copy_grouped"  the last axis kept: a thread group per row;
//   "tiled"             any permutation that moves the last axis: 32x32
//                       shared-memory tiles between the input's last axis
//                       and the output's;
//   "gather"            any permutation: one thread per output element;
//   a transpose rung    permutations that reduce to a batched 2-D transpose.
// A name that cannot run the permutation is refused with the reason.
Support CanImplementPermute(const PermuteArgs& args, std::string_view variant);

// Every name CanImplementPermute knows: the routes and the transpose rungs,
// slowest first.
const std::vector<std::string>& PermuteVariants();

// The route or rung LaunchPermute runs for these arguments ("empty" when
// there are no elements); empty when CanImplementPermute refuses.
std::string PermuteVariantName(const PermuteArgs& args, std::string_view variant);

// Enqueues the permutation on `stream`. Axes of size 1 are dropped and axes
// that stay adjacent are merged first; then the default routes (see
// src/heuristics/transpose_heuristics.h): identity -> one copy; last axis kept
// -> row_copy or row_copy_grouped; a batched 2-D transpose -> the transpose
// ladder; anything else -> tiled. Returns cudaErrorInvalidValue when
// CanImplementPermute refuses.
cudaError_t LaunchPermute(const PermuteArgs& args, std::string_view variant,
                          cudaStream_t stream);

}  // namespace gpucompute::kernels

#endif  // GPUCOMPUTE_KERNELS_TRANSPOSE_H_
